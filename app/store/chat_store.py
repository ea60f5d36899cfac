"""``ChatStore``: every read and write of chats and their messages; ``open_chat_store``: the user's, at start.

The store is made of the database it writes to (``ChatDatabase``: the connection, its transactions and health
checks) and the searches across all chats (``ChatSearch``); the chats and their message trees are its own.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from ..attachments import Attachment, ReplySources, attachments_to_json
from .opening import MEMORY, ChatDatabase, DatabaseLockedError
from .records import CONVERSATION_COLUMNS, MESSAGE_COLUMNS, Conversation, MessageNode, StoredMessage
from .schema import SchemaTooNewError
from .search import ChatSearch


class _Place(Enum):
    LEAF = "after the branch shown"


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just wrote."""
    if cur.lastrowid is None:
        raise sqlite3.DatabaseError("the insert wrote no row")
    return cur.lastrowid


class ChatStore:
    """All reads and writes of chats. Used from the GUI thread only.

    ``path``: the database file (None: the user's; ``MEMORY``: none). ``database.recovered`` is set when the
    file was corrupt and has been replaced (the caller should tell the user where the backup is).
    """

    def __init__(self, path: Path | str | None = None, *, busy_timeout_s: float | None = None) -> None:
        self.database = ChatDatabase(path, busy_timeout_s)
        self._db = self.database.connection
        self.search = ChatSearch(self._db)

    def close(self) -> None:
        self.database.close()

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
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations ORDER BY updated DESC, id DESC"
        ).fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
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
        with self.database.transaction():
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
        row = self._db.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
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
        return self._branch(leaf) if leaf is not None else []

    def _branch(self, message_id: int) -> list[StoredMessage]:
        """The messages from the conversation's first one down to ``message_id``, in order."""
        rows = self._db.execute(
            "WITH RECURSIVE up(id) AS (VALUES (?) UNION ALL"
            " SELECT m.parent_id FROM messages m JOIN up ON m.id = up.id WHERE m.parent_id IS NOT NULL)"
            f" SELECT {MESSAGE_COLUMNS} FROM messages JOIN up USING (id) ORDER BY id",
            (message_id,),
        ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def tree(self, conversation_id: int) -> list[StoredMessage]:
        """Every message of a chat, on every branch, oldest first (so each comes after its parent)."""
        rows = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
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
        with self.database.transaction():
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
        branch = self._branch(message_id)
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
    recovered = store.database.recovered
    return store, recovered.message() if recovered is not None else None
