"""``ChatStore``: every read and write of chats and their messages; ``open_chat_store``: the user's, at start."""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from .. import paths
from ..attachments import Attachment, ReplySources, attachments_to_json
from .opening import MEMORY, DatabaseLockedError, Recovery, _CorruptDatabase, connect, move_aside
from .records import _CONVERSATION_COLUMNS, _MESSAGE_COLUMNS, Conversation, MessageNode, StoredMessage
from .schema import SchemaTooNewError, user_version
from .search import MATCH_END, MATCH_START, SearchHit, _match_expression


class _Place(Enum):
    LEAF = "after the branch shown"


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just wrote."""
    if cur.lastrowid is None:
        raise sqlite3.DatabaseError("the insert wrote no row")
    return cur.lastrowid


class ChatStore:
    """All reads and writes of chats. Used from the GUI thread only.

    ``recovered`` is set when the file was corrupt and has been replaced
    (the caller should tell the user where the backup is).
    """

    def __init__(self, path: Path | str | None = None, *, busy_timeout_s: float | None = None) -> None:
        self.path: Path | str = MEMORY if path == MEMORY else Path(path) if path else paths.database_path()
        self.recovered: Recovery | None = None
        try:
            self._db = connect(self.path, busy_timeout_s)
        except _CorruptDatabase as exc:
            backup = move_aside(self.path)
            self._db = connect(self.path, busy_timeout_s)
            self.recovered = Recovery(backup, str(exc))

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

    def schema_version(self) -> int:
        return user_version(self._db)

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
        from ..stats import ReplyStats  # local: keeps this module importable on its own

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
            replies = (ReplyStats.from_stats_json(m["stats_json"]) for m in messages if m["role"] == "assistant")
            models = {s.model for s in replies if s is not None}
            if not models or not models <= names:
                continue
            text = "\n".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))
            if len(text) > budget:
                break
            texts.append(text)
            budget -= len(text)
        return texts


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
