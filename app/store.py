"""Conversations and messages in SQLite (WAL), with a schema version.

The schema version lives in ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes
the database from version i to i+1, so an old file is upgraded in place.

Durability: every write is its own transaction, committed before the call
returns, with ``synchronous=FULL`` (the WAL is synced at each commit), so a
message the app has saved survives the process being killed or the power
failing. A database file that SQLite reports as corrupt is moved aside to a
timestamped backup and a new one is started; a database locked by another
program is reported (``DatabaseLockedError``) and never touched.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import paths

_MIGRATIONS: list[str] = [
    # 0 -> 1
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        created REAL NOT NULL,
        stats_json TEXT
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # 1 -> 2: how each run of a reply's text came (app/marks.py); NULL for older messages
    """
    ALTER TABLE messages ADD COLUMN marks_json TEXT;
    """,
]
SCHEMA_VERSION = len(_MIGRATIONS)


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    content: str
    created: float
    stats_json: str | None = None
    marks_json: str | None = None  # app.marks.TokenMarks, for replies


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer version of the app."""


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


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just wrote."""
    if cur.lastrowid is None:
        raise sqlite3.DatabaseError("the insert wrote no row")
    return cur.lastrowid


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


class ChatStore:
    """All reads and writes of chats. Used from the GUI thread only.

    ``recovered`` is set when the file was corrupt and has been replaced
    (the caller should tell the user where the backup is).
    """

    def __init__(self, path: Path | str | None = None, *, busy_timeout_s: float | None = None) -> None:
        self.path: Path | str = MEMORY if path == MEMORY else Path(path) if path else paths.database_path()
        self._timeout = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        self.recovered: Recovery | None = None
        try:
            self._db = self._open()
        except _CorruptDatabase as exc:
            backup = self._move_aside()
            self._db = self._open()
            self.recovered = Recovery(backup, str(exc))

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: autocommit; each write below is one statement or an explicit transaction.
        db = sqlite3.connect(self.path, isolation_level=None, timeout=self._timeout)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a saved message survives power loss, not only a crash
            db.execute("PRAGMA foreign_keys=ON")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise _CorruptDatabase("quick check failed: " + " ".join(str(check).split())[:200])
            self._db = db
            self._migrate()
        except sqlite3.Error as exc:
            db.close()
            if _is_locked(exc):
                raise DatabaseLockedError(
                    f"the chat database {self.path} is locked by another program "
                    "(is Lookahead Chat already open?)"
                ) from exc
            if _is_corrupt(exc):
                raise _CorruptDatabase(str(exc)) from exc
            raise
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        """Rename the database (and its WAL files) to ``<name>.corrupt-<timestamp>``; returns the new path."""
        assert isinstance(self.path, Path)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while backup.exists():
            n += 1
            backup = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        os.replace(self.path, backup)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                os.replace(side, backup.with_name(backup.name + suffix))
        return backup

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Several statements as one commit: a kill between them leaves neither."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{self.path} has schema version {version}; this app knows up to {SCHEMA_VERSION}"
            )
        for v in range(version, SCHEMA_VERSION):
            # One transaction per step: a failed migration leaves the previous version intact.
            try:
                self._db.executescript("BEGIN;" + _MIGRATIONS[v] + f"PRAGMA user_version={v + 1};COMMIT;")
            except sqlite3.Error:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    def synchronous(self) -> int:
        """SQLite's sync level: 2 = FULL."""
        return int(self._db.execute("PRAGMA synchronous").fetchone()[0])

    def integrity_check(self) -> str:
        return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    # --- conversations ---

    def create_conversation(self, title: str, system_prompt: str = "") -> Conversation:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations(title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
            (title, system_prompt, now, now),
        )
        return Conversation(_row_id(cur), title, system_prompt, now, now)

    def conversations(self) -> list[Conversation]:
        """Most recently updated first."""
        rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(**dict(row)) if row else None

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        self._db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def _touch(self, conversation_id: int) -> None:
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    # --- messages ---

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        stats_json: str | None = None,
        marks_json: str | None = None,
    ) -> StoredMessage:
        now = time.time()
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, created, stats_json, marks_json)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, now, stats_json, marks_json),
            )
            self._touch(conversation_id)
        return StoredMessage(_row_id(cur), conversation_id, role, content, now, stats_json, marks_json)

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def chat_texts(self, model_name: str, max_chars: int = 400_000) -> list[str]:
        """The text of every chat whose replies all came from ``model_name``, newest first, within ``max_chars``.

        For lookahead to draft from (engine ``CorpusIndex``): a chat answered by another model,
        even in part, is left out.
        """
        from .stats import ReplyStats  # local: keeps this module importable on its own

        rows = self._db.execute(
            "SELECT m.conversation_id, m.role, m.content, m.stats_json FROM messages m"
            " JOIN conversations c ON c.id = m.conversation_id ORDER BY c.updated DESC, c.id DESC, m.id"
        ).fetchall()
        texts: list[str] = []
        budget = max_chars
        for _conv, group in itertools.groupby(rows, key=lambda row: row["conversation_id"]):
            messages = list(group)
            replies = (ReplyStats.from_json(m["stats_json"]) for m in messages if m["role"] == "assistant")
            if {s.model for s in replies if s is not None} != {model_name}:
                continue
            text = "\n".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))
            if len(text) > budget:
                break
            texts.append(text)
            budget -= len(text)
        return texts

    def delete_messages_from(self, conversation_id: int, message_id: int) -> int:
        """Delete ``message_id`` and every later message of the conversation (edit & resend, regenerate)."""
        with self._transaction():
            cur = self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id)
            )
            self._touch(conversation_id)
        return cur.rowcount


def open_chat_store() -> tuple[ChatStore, str | None]:
    """The user's chat database, and what went wrong opening it (for the user), if anything.

    A damaged file is replaced (with a backup); one that cannot be used at all
    (locked by another program, from a newer version) is left as it is and the
    chats of this session are kept in memory.
    """
    try:
        store = ChatStore()
    except (DatabaseLockedError, SchemaTooNewError, sqlite3.Error, OSError) as exc:
        hint = (
            "Close the other program and restart Lookahead Chat to see your chats again."
            if isinstance(exc, DatabaseLockedError)
            else "The file was left as it is."
        )
        notice = (
            f"The chats cannot be opened: {exc}.\n\nYou can keep chatting, but this session's chats "
            f"will not be saved. {hint}"
        )
        return ChatStore(MEMORY), notice
    return store, store.recovered.message() if store.recovered is not None else None


def export_markdown(conversation: Conversation, messages: Iterable[StoredMessage]) -> str:
    """A conversation as a Markdown document (File → Export chat…)."""
    from .stats import ReplyStats  # local: keeps this module importable on its own

    out = [f"# {conversation.title}", ""]
    if conversation.system_prompt.strip():
        out += ["> **System:** " + conversation.system_prompt.strip().replace("\n", "\n> "), ""]
    for m in messages:
        out += [f"## {m.role.capitalize()}", "", m.content.rstrip(), ""]
        stats = ReplyStats.from_json(m.stats_json)
        if stats is not None:
            out += [f"*{stats.summary_line()}*", ""]
    return "\n".join(out).rstrip() + "\n"
