"""Attaching files to a message: what of them fits goes before the message's own words.

A reply in the app, the command line's ``--attach``, a workload's files in a bench or a speed report, and
reading the next prompt ahead all put files into a message here, so the prompt is the same wherever it is
built; each caller then tells the engine which texts to draft from, and says in its own way what went in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from engine.decoding.text import Message
from engine.documents import Document, DocumentContext, with_documents


class FitsDocuments(Protocol):
    """What attaching needs of a chat session (``ChatSession.documents_context``)."""

    def documents_context(
        self, messages: Sequence[Message], docs: Sequence[Document], max_tokens: int,
    ) -> DocumentContext: ...


def attach_documents(
    session: FitsDocuments, messages: Sequence[Message], docs: Sequence[Document], max_tokens: int,
) -> tuple[list[Message], DocumentContext]:
    """``messages`` with ``docs`` (whole, or their passages that best match the question) put into the last one,
    leaving room for a reply of ``max_tokens``; and what of each file went in."""
    context = session.documents_context(messages, docs, max_tokens)
    last = messages[-1]
    return [*messages[:-1], replace(last, content=with_documents(last.content, context))], context
