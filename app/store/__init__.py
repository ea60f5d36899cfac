"""Conversations and messages in SQLite (WAL), with a schema version.

    schema       the tables and their migrations (the version in ``PRAGMA user_version``)
    records      the rows as dataclasses: ``Conversation``, ``StoredMessage``, ``MessageNode``
    opening      ``ChatDatabase``: the connection, its settings, transactions and health checks; a locked file
                 is reported, a corrupt one moved aside
    search       ``ChatSearch``: full-text search of every chat (what a match is, the FTS5 query typed words
                 become) and the chats one model wrote, for lookahead to draft from
    chat_store   ``ChatStore``, every read and write of chats; ``open_chat_store`` at the app's start

Writing chats out to files (Markdown, JSON) and reading them back is ``app.backup``'s.
"""

from .chat_store import ChatStore, open_chat_store
from .opening import MEMORY, ChatDatabase, DatabaseLockedError, Recovery
from .records import Conversation, MessageNode, StoredMessage
from .schema import SCHEMA_VERSION, SchemaTooNewError
from .search import MATCH_END, MATCH_START, ChatSearch, SearchHit

__all__ = [
    "MATCH_END",
    "MATCH_START",
    "MEMORY",
    "SCHEMA_VERSION",
    "ChatDatabase",
    "ChatSearch",
    "ChatStore",
    "Conversation",
    "DatabaseLockedError",
    "MessageNode",
    "Recovery",
    "SchemaTooNewError",
    "SearchHit",
    "StoredMessage",
    "open_chat_store",
]
