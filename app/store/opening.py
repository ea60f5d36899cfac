"""The chat database file: the connection's settings, what is done when the file is locked or broken, and
``ChatDatabase``, which owns the connection (its transactions, its health checks, closing it).

Durability: every write is its own transaction, committed before the call
returns, with ``synchronous=FULL`` (the WAL is synced at each commit), so a
message the app has saved survives the process being killed or the power
failing. A database file that SQLite reports as corrupt is moved aside to a
timestamped backup and a new one is started; a database locked by another
program is reported (``DatabaseLockedError``) and never touched.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from .schema import migrate, user_version


class DatabaseLockedError(RuntimeError):
    """Another program holds a lock on the chat database (longer than ``BUSY_TIMEOUT_S``)."""


# How long a statement waits for another connection's lock before giving up.
BUSY_TIMEOUT_S = 5.0
MEMORY = ":memory:"
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


class _CorruptDatabase(Exception):
    """The file is not a database, or its pages fail SQLite's quick check."""


@dataclass(frozen=True)
class Recovery:
    """A corrupt database file that was moved aside when the store was opened."""

    backup: Path
    reason: str

    def message(self) -> str:
        return (
            f"The chat database was damaged ({self.reason}) and could not be opened. "
            f"It has been kept as {self.backup} and a new, empty one was started."
        )


def _error_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    return None if code is None else code & 0xFF  # the primary code


def _is_locked(exc: sqlite3.Error) -> bool:
    code = _error_code(exc)
    return code in (_SQLITE_BUSY, _SQLITE_LOCKED) if code is not None else "locked" in str(exc)


def _is_corrupt(exc: sqlite3.Error) -> bool:
    code = _error_code(exc)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc)
    return "not a database" in text or "malformed" in text


def connect(path: Path | str, busy_timeout_s: float | None = None) -> sqlite3.Connection:
    """A connection to the database at ``path``, checked and upgraded to the current schema.

    ``busy_timeout_s``: how long a statement waits for another connection's lock (None: ``BUSY_TIMEOUT_S``).
    Raises ``DatabaseLockedError`` if another program holds the file, ``_CorruptDatabase`` if it is damaged.
    """
    timeout = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    # isolation_level=None: autocommit; each write of ChatStore is one statement or an explicit transaction.
    db = sqlite3.connect(path, isolation_level=None, timeout=timeout)
    try:
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a saved message survives power loss, not only a crash
        db.execute("PRAGMA foreign_keys=ON")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _CorruptDatabase("quick check failed: " + " ".join(str(check).split())[:200])
        migrate(db, path)
    except sqlite3.Error as exc:
        db.close()
        if _is_locked(exc):
            raise DatabaseLockedError(
                f"the chat database {path} is locked by another program "
                "(is Lookahead Chat already open?)"
            ) from exc
        if _is_corrupt(exc):
            raise _CorruptDatabase(str(exc)) from exc
        raise
    except BaseException:
        db.close()
        raise
    return db


def move_aside(path: Path | str) -> Path:
    """Rename the database (and its WAL files) to ``<name>.corrupt-<timestamp>``; returns the new path."""
    assert isinstance(path, Path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, backup)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, backup.with_name(backup.name + suffix))
    return backup


class ChatDatabase:
    """The open chat database: ``connection``, its transactions and health checks. Used from the GUI thread only.

    ``path`` None is the user's database (``paths.database_path``); ``MEMORY`` keeps the chats in memory.
    ``recovered`` is set when the file was corrupt and has been replaced (the caller should tell the user
    where the backup is).
    """

    def __init__(self, path: Path | str | None = None, busy_timeout_s: float | None = None) -> None:
        self.path: Path | str = MEMORY if path == MEMORY else Path(path) if path else paths.database_path()
        self.recovered: Recovery | None = None
        try:
            self.connection = connect(self.path, busy_timeout_s)
        except _CorruptDatabase as exc:
            backup = move_aside(self.path)
            self.connection = connect(self.path, busy_timeout_s)
            self.recovered = Recovery(backup, str(exc))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Several statements as one commit: a kill between them leaves neither."""
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    def schema_version(self) -> int:
        return user_version(self.connection)

    def journal_mode(self) -> str:
        return str(self.connection.execute("PRAGMA journal_mode").fetchone()[0])

    def synchronous(self) -> int:
        """SQLite's sync level: 2 = FULL."""
        return int(self.connection.execute("PRAGMA synchronous").fetchone()[0])

    def integrity_check(self) -> str:
        return str(self.connection.execute("PRAGMA integrity_check").fetchone()[0])

    def close(self) -> None:
        self.connection.close()
