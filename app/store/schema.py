"""The chat database's tables and their migrations, with a schema version.

The schema version lives in ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes
the database from version i to i+1, so an old file is upgraded in place.

A chat's messages form a tree: each message has a parent (None for the first),
an edited message or a regenerated reply is a sibling of the one it replaces,
and the conversation remembers the last message of the branch it shows
(``current_leaf_id``). ``message_text`` is an FTS5 index of the messages' text,
kept in step by triggers.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

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


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer version of the app."""


def user_version(db: sqlite3.Connection) -> int:
    """The schema version the database is at (``PRAGMA user_version``)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, path: Path | str) -> None:
    """Upgrade the database to ``SCHEMA_VERSION`` (``path``: the file, for the error message)."""
    version = user_version(db)
    if version > SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"{path} has schema version {version}; this app knows up to {SCHEMA_VERSION}"
        )
    for v in range(version, SCHEMA_VERSION):
        # One transaction per step: a failed migration leaves the previous version intact.
        try:
            db.executescript("BEGIN;" + _MIGRATIONS[v] + f"PRAGMA user_version={v + 1};COMMIT;")
        except sqlite3.Error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
