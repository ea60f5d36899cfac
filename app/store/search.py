"""Full-text search of the messages: what a match is, and how typed words become an FTS5 query."""

from __future__ import annotations

from dataclasses import dataclass

from engine.documents import WORD, fts_strings

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
