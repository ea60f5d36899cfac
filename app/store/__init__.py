"""Conversations and messages in SQLite (WAL), with a schema version.

    schema       the tables and their migrations (the version in ``PRAGMA user_version``)
    records      the rows as dataclasses: ``Conversation``, ``StoredMessage``, ``MessageNode``
    opening      the connection's settings; a locked file is reported, a corrupt one moved aside
    search       what a search match is, and the FTS5 query typed words become
    chat_store   ``ChatStore``, every read and write of chats; ``open_chat_store`` at the app's start

Writing chats out to files (Markdown, JSON) and reading them back is ``app.backup``'s.
"""

from .chat_store import ChatStore, open_chat_store
from .opening import MEMORY, DatabaseLockedError, Recovery
from .records import Conversation, MessageNode, StoredMessage
from .schema import SCHEMA_VERSION, SchemaTooNewError
from .search import MATCH_END, MATCH_START, SearchHit

__all__ = [
    "MATCH_END",
    "MATCH_START",
    "MEMORY",
    "SCHEMA_VERSION",
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
