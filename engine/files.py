"""Where Lookahead Chat keeps its files, and how it writes them.

``LOOKAHEAD_CHAT_HOME`` puts everything (cache, data, settings) under one folder: tests and the self-test point
it at a temporary one so they never touch a user's files. Without it the platform's user folders are used. The
app's data and settings folders are app/paths.py's; the engine keeps only caches (curves, n-grams, the library's
headers, the load probe's verdicts), all under ``cache_root()``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "lookahead-chat"
HOME_ENV = "LOOKAHEAD_CHAT_HOME"
DATA_DIR = Path(__file__).resolve().parent / "data"  # what ships with the engine: the workloads and their files


def file_identity(path: str | os.PathLike[str], st: os.stat_result | None = None) -> str:
    """What tells one file, as it is now, from any other without reading it: its absolute path, size and
    modification time in ns (``st``: its ``os.stat``, if taken already). A file changed in place or replaced
    gets another identity; the caches keyed by a model file use this."""
    st = st if st is not None else os.stat(path)
    return f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"


def home_override() -> Path | None:
    """The folder ``LOOKAHEAD_CHAT_HOME`` names, if it is set."""
    value = os.environ.get(HOME_ENV)
    return Path(value) if value else None


def cache_root() -> Path:
    """The engine's cache folder: LOOKAHEAD_CHAT_HOME/cache, else the user cache dir."""
    home = home_override()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME))


def write_json_atomic(path: Path, data: object, indent: int | None = None) -> None:
    """Write ``data`` as JSON to ``path`` so that a reader sees the old file or the new one, never half of one.

    The temporary file is the writer's own (two processes saving the same file do not share one), in the same
    folder (so the rename is atomic), and is gone afterwards whether the write worked or not.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=indent)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
