"""Reading across all chats: full-text search of the messages (what a match is, how typed words become an FTS5
query), and the text of the chats one model wrote, for lookahead to draft from."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass

from engine.documents import WORD, fts_strings

from ..stats import ReplyStats

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


def _match_expression(text: str) -> str | None:
    """An FTS5 query for the words of ``text``: each one quoted (so nothing in it is an operator), the last a prefix."""
    words = WORD.findall(text)
    if not words:
        return None
    return " ".join(fts_strings(words)) + "*"


class ChatSearch:
    """Searches of every chat in the database ``db`` (``ChatStore.search``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def find(self, text: str, limit: int = 50, conversation_id: int | None = None) -> list[SearchHit]:
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
