"""Where the app keeps its files: one module, so tests can redirect all of it.

Set ``LOOKAHEAD_CHAT_HOME`` to put data and settings under one directory
(tests and the self-test point it at a temp dir so they never touch the
user's chats); otherwise the platform's user data/config dirs are used.
Both are private to the user (mode 0700): chats and settings are nobody else's business.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from engine.files import APP_NAME, HOME_ENV, home_override

PRIVATE_DIR_MODE = 0o700
__all__ = ["APP_NAME", "HOME_ENV", "config_dir", "data_dir", "database_path", "log_dir", "settings_path"]


def data_dir() -> Path:
    """Directory for the chat database (created on first use)."""
    home = home_override()
    path = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return _private_dir(path)


def config_dir() -> Path:
    """Directory for the settings file (created on first use)."""
    home = home_override()
    path = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    return _private_dir(path)


def log_dir() -> Path:
    """Directory for the app's log files, in the data folder (created on first use; Help → Open log folder)."""
    return _private_dir(data_dir() / "logs")


def _private_dir(path: Path) -> Path:
    """Create ``path`` readable by its owner only; tighten it if an older version made it wider."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)  # the mode is filtered by the umask...
    if os.name == "posix" and path.stat().st_mode & 0o777 != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)  # ...and an existing dir keeps its mode: set it explicitly
    return path


def database_path() -> Path:
    return data_dir() / "chats.sqlite3"


def settings_path() -> Path:
    return config_dir() / "settings.json"


def resources_dir() -> Path:
    """The repository's ``resources/`` (icons, styles); may be absent in an installed wheel."""
    return Path(__file__).resolve().parent.parent / "resources"
