"""Conversations and messages in SQLite (WAL), with a schema version.

The schema version lives in ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes
the database from version i to i+1, so an old file is upgraded in place.

A chat's messages form a tree: each message has a parent (None for the first),
an edited message or a regenerated reply is a sibling of the one it replaces,
and the conversation remembers the last message of the branch it shows
(``current_leaf_id``). ``message_text`` is an FTS5 index of the messages' text,
kept in step by triggers.

Durability: every write is its own transaction, committed before the call
returns, with ``synchronous=FULL`` (the WAL is synced at each commit), so a
message the app has saved survives the process being killed or the power
failing. A database file that SQLite reports as corrupt is moved aside to a
timestamped backup and a new one is started; a database locked by another
program is reported (``DatabaseLockedError``) and never touched.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from engine.documents import WORD, fts_strings

from . import paths
from .attachments import Attachment, ReplySources, attachments_from_json, attachments_to_json

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
    # 2 -> 3: alternatives (a tree of messages: each one's parent, and the branch a chat shows),
    # per-chat settings, and full-text search over the messages
    """
    -- No foreign key: a cascade down a long chat would recurse once per message, past SQLite's limit.
    ALTER TABLE messages ADD COLUMN parent_id INTEGER;
    UPDATE messages SET parent_id = (
        SELECT MAX(p.id) FROM messages p WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id
    );
    CREATE INDEX messages_by_parent ON messages(parent_id);
    ALTER TABLE conversations ADD COLUMN current_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL;
    UPDATE conversations SET current_leaf_id = (SELECT MAX(id) FROM messages WHERE conversation_id = conversations.id);
    ALTER TABLE conversations ADD COLUMN settings_json TEXT;
    CREATE VIRTUAL TABLE message_text USING fts5(content, content='messages', content_rowid='id');
    INSERT INTO message_text(message_text) VALUES ('rebuild');
    CREATE TRIGGER message_text_insert AFTER INSERT ON messages BEGIN
        INSERT INTO message_text(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER message_text_delete AFTER DELETE ON messages BEGIN
        INSERT INTO message_text(message_text, rowid, content) VALUES ('delete', old.id, old.content);
    END;
    CREATE TRIGGER message_text_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO message_text(message_text, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO message_text(rowid, content) VALUES (new.id, new.content);
    END;
    """,
    # 3 -> 4: files attached to a user's message (app.attachments: their text, kept), and what of them the model
    # was given once the reply placed them (app.attachments.ReplySources); NULL for messages without files.
    # Search stays on what people wrote: neither column is in ``message_text``.
    """
    ALTER TABLE messages ADD COLUMN attachments_json TEXT;
    ALTER TABLE messages ADD COLUMN documents_json TEXT;
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
    current_leaf_id: int | None = None  # the last message of the branch the chat shows


_CONVERSATION_COLUMNS = "id, title, system_prompt, created, updated, current_leaf_id"


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    content: str
    created: float
    stats_json: str | None = None
    marks_json: str | None = None  # app.marks.TokenMarks, for replies
    parent_id: int | None = None  # the message this one follows (None: the chat's first)
    attachments_json: str | None = None  # app.attachments: the files a user's message came with
    documents_json: str | None = None  # app.attachments.ReplySources: what of them the model was given

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The files this message came with (none for most)."""
        return attachments_from_json(self.attachments_json)

    @property
    def documents(self) -> ReplySources | None:
        """What of its files the model was given (None: no files, or not placed yet)."""
        return ReplySources.from_json(self.documents_json)


_MESSAGE_COLUMNS = (
    "id, conversation_id, role, content, created, stats_json, marks_json, parent_id, attachments_json, documents_json"
)


class _Place(Enum):
    LEAF = "after the branch shown"


@dataclass(frozen=True)
class MessageNode:
    """A message of a chat written all at once (fork, import): ``key`` and ``parent`` are the caller's ids."""

    key: int
    parent: int | None
    role: str
    content: str
    created: float
    stats_json: str | None = None
    marks_json: str | None = None
    attachments_json: str | None = None
    documents_json: str | None = None

    @classmethod
    def of(cls, m: StoredMessage) -> MessageNode:
        return cls(m.id, m.parent_id, m.role, m.content, m.created, m.stats_json, m.marks_json,
                   m.attachments_json, m.documents_json)


# Around each matched word in ``SearchHit.snippet``: characters no message contains.
MATCH_START, MATCH_END = "\x02", "\x03"


@dataclass(frozen=True)
class SearchHit:
    """A message that matched a search, with the text around the match."""

    conversation_id: int
    title: str
    message_id: int
    role: str
    created: float
    snippet: str  # each matched word between MATCH_START and MATCH_END


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
        rows = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations ORDER BY updated DESC, id DESC"
        ).fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return Conversation(**dict(row)) if row else None

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        self._db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))

    def conversation_settings(self, conversation_id: int) -> dict[str, Any]:
        """The settings saved with a chat (empty if none, or if what was saved is unreadable)."""
        row = self._db.execute("SELECT settings_json FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        try:
            settings = json.loads(row[0]) if row and row[0] else {}
        except ValueError:
            return {}
        return settings if isinstance(settings, dict) else {}

    def set_conversation_settings(self, conversation_id: int, settings: dict[str, Any]) -> None:
        """Save a chat's own settings (a JSON object), replacing what it had."""
        self._db.execute(
            "UPDATE conversations SET settings_json = ? WHERE id = ?", (json.dumps(settings), conversation_id)
        )

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
        *,
        parent_id: int | None | _Place = _Place.LEAF,
        attachments: Sequence[Attachment] = (),
    ) -> StoredMessage:
        """Add a message after ``parent_id`` (by default, after the branch shown); it becomes the branch shown.

        A message added beside another (the same parent) is an alternative to it: an edited
        message, a regenerated reply. The one it replaces stays, one flip away. ``attachments``:
        the files a user's message came with (what the model is given of them is set later,
        ``set_placed_documents``).
        """
        now = time.time()
        attachments_json = attachments_to_json(attachments)
        with self._transaction():
            if isinstance(parent_id, _Place):
                parent_id = self._current_leaf(conversation_id)
            message_id = self._insert_message(
                conversation_id, parent_id, role, content, now, stats_json, marks_json, attachments_json
            )
            self._db.execute(
                "UPDATE conversations SET current_leaf_id = ? WHERE id = ?", (message_id, conversation_id)
            )
            self._touch(conversation_id)
        return StoredMessage(message_id, conversation_id, role, content, now, stats_json, marks_json, parent_id,
                             attachments_json)

    def set_placed_documents(
        self, message_id: int, documents: ReplySources, attachments: Sequence[Attachment] | None = None
    ) -> None:
        """What of a user message's files the model was given (and, if given, its files again: their token counts
        known now). Later turns send the message with ``documents.text`` placed before it, as it was."""
        if attachments is None:
            self._db.execute(
                "UPDATE messages SET documents_json = ? WHERE id = ?", (documents.to_json(), message_id)
            )
        else:
            self._db.execute(
                "UPDATE messages SET documents_json = ?, attachments_json = ? WHERE id = ?",
                (documents.to_json(), attachments_to_json(attachments), message_id),
            )

    def message(self, message_id: int) -> StoredMessage | None:
        """One message by its id (None: no such message, e.g. its chat was deleted)."""
        row = self._db.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        return StoredMessage(**dict(row)) if row else None

    def _insert_message(
        self,
        conversation_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        created: float,
        stats_json: str | None,
        marks_json: str | None,
        attachments_json: str | None = None,
        documents_json: str | None = None,
    ) -> int:
        cur = self._db.execute(
            "INSERT INTO messages(conversation_id, parent_id, role, content, created, stats_json, marks_json,"
            " attachments_json, documents_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, content, created, stats_json, marks_json, attachments_json,
             documents_json),
        )
        return _row_id(cur)

    def _current_leaf(self, conversation_id: int) -> int | None:
        """The last message of the branch a chat shows (its newest message if that was never set)."""
        row = self._db.execute(
            "SELECT COALESCE(current_leaf_id, (SELECT MAX(id) FROM messages WHERE conversation_id = c.id))"
            " FROM conversations c WHERE c.id = ?",
            (conversation_id,),
        ).fetchone()
        return row[0] if row else None

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        """The branch the chat shows, first message to last."""
        leaf = self._current_leaf(conversation_id)
        return self.branch(leaf) if leaf is not None else []

    def branch(self, message_id: int) -> list[StoredMessage]:
        """The messages from the conversation's first one down to ``message_id``, in order."""
        rows = self._db.execute(
            "WITH RECURSIVE up(id) AS (VALUES (?) UNION ALL"
            " SELECT m.parent_id FROM messages m JOIN up ON m.id = up.id WHERE m.parent_id IS NOT NULL)"
            f" SELECT {_MESSAGE_COLUMNS} FROM messages JOIN up USING (id) ORDER BY id",
            (message_id,),
        ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def tree(self, conversation_id: int) -> list[StoredMessage]:
        """Every message of a chat, on every branch, oldest first (so each comes after its parent)."""
        rows = self._db.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def siblings(self, message_id: int) -> list[int]:
        """A message and its alternatives (same parent, same role), oldest first."""
        rows = self._db.execute(
            "SELECT s.id FROM messages s JOIN messages m ON m.id = ?"
            " WHERE s.conversation_id = m.conversation_id AND s.parent_id IS m.parent_id AND s.role = m.role"
            " ORDER BY s.id",
            (message_id,),
        ).fetchall()
        return [r[0] for r in rows]

    def alternatives(self, conversation_id: int) -> dict[int, list[int]]:
        """Every message of a chat that has alternatives, mapped to ``siblings`` of it (one query for a whole chat)."""
        rows = self._db.execute(
            "SELECT id, parent_id, role FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        groups: dict[tuple[int | None, str], list[int]] = {}
        for r in rows:
            groups.setdefault((r["parent_id"], r["role"]), []).append(r["id"])
        return {m: ids for ids in groups.values() if len(ids) > 1 for m in ids}

    def select_branch(self, message_id: int) -> None:
        """Show the branch through ``message_id``, down to its newest last message."""
        self._db.execute(
            "WITH RECURSIVE down(id) AS (VALUES (?) UNION ALL"
            " SELECT m.id FROM messages m JOIN down ON m.parent_id = down.id)"
            " UPDATE conversations SET current_leaf_id = (SELECT MAX(id) FROM down)"
            " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
            (message_id, message_id),
        )

    def set_current_leaf(self, message_id: int) -> None:
        """Show the branch that ends at ``message_id`` (a reply to it is on its way)."""
        self._db.execute(
            "UPDATE conversations SET current_leaf_id = ?"
            " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
            (message_id, message_id),
        )

    def insert_conversation(
        self,
        title: str,
        system_prompt: str,
        messages: Sequence[MessageNode],
        current_leaf: int | None = None,
        *,
        created: float | None = None,
        updated: float | None = None,
        settings: dict[str, Any] | None = None,
    ) -> Conversation:
        """A whole chat at once, as one commit (fork, import); ``messages`` come parents first.

        The nodes' keys are the caller's own; the messages get new ids. ``current_leaf`` (a key) is
        the branch shown; None: the last message.
        """
        now = time.time()
        created = now if created is None else created
        updated = now if updated is None else updated
        new_ids: dict[int, int] = {}
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO conversations(title, system_prompt, created, updated, settings_json)"
                " VALUES (?, ?, ?, ?, ?)",
                (title, system_prompt, created, updated, json.dumps(settings) if settings else None),
            )
            conversation_id = _row_id(cur)
            for m in messages:
                if m.parent is not None and m.parent not in new_ids:
                    raise ValueError(f"message {m.key} comes before its parent {m.parent}")
                if m.key in new_ids:
                    raise ValueError(f"message id {m.key} is used twice")
                new_ids[m.key] = self._insert_message(
                    conversation_id, None if m.parent is None else new_ids[m.parent], m.role, m.content,
                    m.created, m.stats_json, m.marks_json, m.attachments_json, m.documents_json,
                )
            if current_leaf is not None and current_leaf not in new_ids:
                raise ValueError(f"the message shown ({current_leaf}) is not in the chat")
            leaf = new_ids.get(current_leaf) if current_leaf is not None else max(new_ids.values(), default=None)
            self._db.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?", (leaf, conversation_id))
        conv = self.conversation(conversation_id)
        assert conv is not None
        return conv

    def fork_conversation(self, message_id: int) -> Conversation:
        """A new chat with the branch down to ``message_id`` (the original is left as it is)."""
        branch = self.branch(message_id)
        if not branch:
            raise ValueError(f"no message {message_id}")
        source = self.conversation(branch[0].conversation_id)
        assert source is not None
        return self.insert_conversation(
            f"{source.title} (fork)",
            source.system_prompt,
            [MessageNode.of(m) for m in branch],
            settings=self.conversation_settings(source.id),
        )

    def search(self, text: str, limit: int = 50, conversation_id: int | None = None) -> list[SearchHit]:
        """Messages with every word of ``text`` (the last may be the start of a word).

        Across all chats the best matches come first; in one chat (``conversation_id``), the
        order of the chat. The input is taken as plain words: quotes and FTS5 operators in it
        are only text.
        """
        match = _match_expression(text)
        if match is None:
            return []
        params: list[object] = [MATCH_START, MATCH_END, match]
        where = "message_text MATCH ?"
        if conversation_id is not None:
            where += " AND m.conversation_id = ?"
            params.append(conversation_id)
        rows = self._db.execute(
            "SELECT m.conversation_id, c.title, m.id AS message_id, m.role, m.created,"
            " snippet(message_text, 0, ?, ?, '…', 16) AS snippet"
            " FROM message_text JOIN messages m ON m.id = message_text.rowid"
            " JOIN conversations c ON c.id = m.conversation_id"
            f" WHERE {where} ORDER BY {'m.id' if conversation_id is not None else 'rank'} LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [SearchHit(**dict(r)) for r in rows]

    def chat_texts(self, model_name: str | Collection[str], max_chars: int = 400_000) -> list[str]:
        """The text of every chat whose replies all came from ``model_name``, newest first, within ``max_chars``.

        ``model_name`` may be several names of the same file (its shown name now, the file name it was shown
        by before), so a model's earlier chats are found under either.

        For lookahead to draft from (engine ``CorpusIndex``): a chat answered by another model,
        even in part, is left out. Each chat's branch shown is its text.
        """
        from .stats import ReplyStats  # local: keeps this module importable on its own

        names = {model_name} if isinstance(model_name, str) else set(model_name)

        rows = self._db.execute(
            "WITH RECURSIVE shown(id) AS ("
            " SELECT COALESCE(current_leaf_id, (SELECT MAX(id) FROM messages WHERE conversation_id = c.id))"
            " FROM conversations c"
            " UNION ALL SELECT m.parent_id FROM messages m JOIN shown ON m.id = shown.id WHERE m.parent_id IS NOT NULL)"
            " SELECT m.conversation_id, m.role, m.content, m.stats_json FROM messages m JOIN shown USING (id)"
            " JOIN conversations c ON c.id = m.conversation_id ORDER BY c.updated DESC, c.id DESC, m.id"
        ).fetchall()
        texts: list[str] = []
        budget = max_chars
        for _conv, group in itertools.groupby(rows, key=lambda row: row["conversation_id"]):
            messages = list(group)
            replies = (ReplyStats.from_json(m["stats_json"]) for m in messages if m["role"] == "assistant")
            models = {s.model for s in replies if s is not None}
            if not models or not models <= names:
                continue
            text = "\n".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))
            if len(text) > budget:
                break
            texts.append(text)
            budget -= len(text)
        return texts


def _match_expression(text: str) -> str | None:
    """An FTS5 query for the words of ``text``: each one quoted (so nothing in it is an operator), the last a prefix."""
    words = WORD.findall(text)
    if not words:
        return None
    return " ".join(fts_strings(words)) + "*"


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
        attachments = m.attachments
        out += [f"## {m.role.capitalize()}", ""]
        if m.content.strip() or not attachments:  # a message that is only files has no text to show
            out += [m.content.rstrip(), ""]
        if attachments:  # by name: the files' text is what the model read, not what was said
            out += ["Attached files:", "", *(f"- {a.name}" for a in attachments), ""]
        stats = ReplyStats.from_json(m.stats_json)
        if stats is not None:
            out += [f"*{stats.summary_line()}*", ""]
    return "\n".join(out).rstrip() + "\n"
