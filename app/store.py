"""Conversations and messages in SQLite (WAL), with a schema version.

The schema version lives in ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes
the database from version i to i+1, so an old file is upgraded in place.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
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


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer version of the app."""


class ChatStore:
    """All reads and writes of chats. Used from the GUI thread only."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else paths.database_path()
        # isolation_level=None: autocommit; each write below is one statement or an explicit transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

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

    def close(self) -> None:
        self._db.close()

    # --- conversations ---

    def create_conversation(self, title: str, system_prompt: str = "") -> Conversation:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations(title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
            (title, system_prompt, now, now),
        )
        return Conversation(int(cur.lastrowid), title, system_prompt, now, now)

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
        self, conversation_id: int, role: str, content: str, stats_json: str | None = None
    ) -> StoredMessage:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages(conversation_id, role, content, created, stats_json) VALUES (?, ?, ?, ?, ?)",
            (conversation_id, role, content, now, stats_json),
        )
        self._touch(conversation_id)
        return StoredMessage(int(cur.lastrowid), conversation_id, role, content, now, stats_json)

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def delete_messages_from(self, conversation_id: int, message_id: int) -> int:
        """Delete ``message_id`` and every later message of the conversation (edit & resend, regenerate)."""
        cur = self._db.execute(
            "DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id)
        )
        self._touch(conversation_id)
        return cur.rowcount


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
