"""Where the app keeps its files: one module, so tests can redirect all of it.

Set ``LOOKAHEAD_CHAT_HOME`` to put data and settings under one directory
(tests and the self-test point it at a temp dir so they never touch the
user's chats); otherwise the platform's user data/config dirs are used.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "lookahead-chat"
HOME_ENV = "LOOKAHEAD_CHAT_HOME"


def _home_override() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value) if value else None


def data_dir() -> Path:
    """Directory for the chat database (created on first use)."""
    home = _home_override()
    path = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    """Directory for the settings file (created on first use)."""
    home = _home_override()
    path = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_path() -> Path:
    return data_dir() / "chats.sqlite3"


def settings_path() -> Path:
    return config_dir() / "settings.json"


def resources_dir() -> Path:
    """The repository's ``resources/`` (icons, styles); may be absent in an installed wheel."""
    return Path(__file__).resolve().parent.parent / "resources"
