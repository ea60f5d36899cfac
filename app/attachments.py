"""Files attached to a user's message, as the app keeps them: the text read from each, not the file.

The text is what the model saw and what lookahead drafts from, so a message's
attachments stay usable after the file is moved or deleted, after a restart,
and in a JSON backup. No Qt here; reading a file is ``engine.documents``'.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.documents import Citation, Document, DocumentContext, with_documents
from engine.units import plain_size

__all__ = ["Attachment", "ReplySources", "attachments_from_json", "attachments_to_json", "as_the_model_read_it"]


@dataclass(frozen=True)
class Attachment:
    """One attached file: its name, what it was, and its text (``engine.documents.Document``'s, kept)."""

    name: str
    kind: str  # "text", "markdown", "code", "csv", "json", "html", "pdf", "docx"
    size_bytes: int
    text: str
    page_starts: tuple[int, ...] = ()
    encoding: str = ""
    path: str = ""  # where it was read from (shown as a tooltip; never read again)
    tokens: int = 0  # the text's tokens for the model it was attached with (0: not counted yet)

    @classmethod
    def from_document(cls, doc: Document, path: str = "", tokens: int = 0) -> Attachment:
        return cls(doc.name, doc.kind, doc.size_bytes, doc.text, doc.page_starts, doc.encoding, path, tokens)

    def document(self) -> Document:
        return Document(self.name, self.kind, self.size_bytes, self.text, self.page_starts, self.encoding)

    @property
    def pages(self) -> int:
        return len(self.page_starts)

    def chip_text(self) -> str:
        """What its chip on the message says, e.g. ``manual.pdf · 1.2 MB · 12 pages · 3,400 tokens``."""
        parts = [self.name, plain_size(self.size_bytes)]
        if self.pages:
            parts.append(f"{self.pages} page" + ("s" if self.pages != 1 else ""))
        if self.tokens:
            parts.append(f"{self.tokens:,} tokens")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["page_starts"] = list(self.page_starts)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attachment:
        return cls(
            name=str(data["name"]), kind=str(data.get("kind", "text")), size_bytes=int(data.get("size_bytes", 0)),
            text=str(data["text"]), page_starts=tuple(int(x) for x in data.get("page_starts", ())),
            encoding=str(data.get("encoding", "")), path=str(data.get("path", "")), tokens=int(data.get("tokens", 0)),
        )


def attachments_to_json(attachments: Sequence[Attachment]) -> str | None:
    """A message's attachments as stored (None: none)."""
    return json.dumps([a.to_dict() for a in attachments], ensure_ascii=False) if attachments else None


def attachments_from_json(text: str | None) -> tuple[Attachment, ...]:
    """Stored attachments back; an unreadable value gives none rather than an error (the message still shows)."""
    if not text:
        return ()
    try:
        return tuple(Attachment.from_dict(d) for d in json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError):
        return ()


@dataclass(frozen=True)
class ReplySources:
    """What of the attached files a reply was given: the passages (citations), each file's share seen,
    and ``text``, the files' part of the message as the model read it (sent again, unchanged, in later turns)."""

    citations: tuple[Citation, ...] = ()
    coverage: dict[str, float] = field(default_factory=dict)  # file name -> fraction of its text in the prompt
    whole: bool = True  # every file went in whole
    text: str = ""  # "" in rows stored before the text was kept: later turns then send the message alone

    def to_json(self) -> str | None:
        if not self.citations and not self.coverage and not self.text:
            return None
        return json.dumps({"text": self.text, "citations": [c.as_dict() for c in self.citations],
                           "coverage": self.coverage, "whole": self.whole}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | None) -> ReplySources | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(tuple(Citation(str(c["name"]), str(c["where"]), str(c["text"])) for c in data["citations"]),
                       {str(k): float(v) for k, v in data.get("coverage", {}).items()}, bool(data.get("whole", True)),
                       str(data.get("text", "")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    @classmethod
    def of(cls, citations: Iterable[Citation], coverage: dict[str, float], whole: bool, text: str = "") -> ReplySources:
        return cls(tuple(citations), dict(coverage), whole, text)

    @classmethod
    def of_context(cls, context: DocumentContext) -> ReplySources:
        """What ``context`` (``ChatSession.documents_context``) put in the message."""
        return cls(tuple(context.citations), dict(context.coverage), context.whole, context.text)


def as_the_model_read_it(content: str, documents: ReplySources | None) -> str:
    """A user message as the model was sent it: the text of its files placed before it (``with_documents``).

    Later turns send an earlier message this way again, so the prompt starts as it did (the cache is reused)
    and follow-up questions still see the files.
    """
    if documents is None or not documents.text:
        return content
    return with_documents(content, DocumentContext(documents.text))
