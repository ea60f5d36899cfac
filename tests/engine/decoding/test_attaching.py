"""Attaching files to a message, the one way the app, the command line, the benches and reading ahead do it; the
session's budget is counted in words here, so no model is loaded."""

from __future__ import annotations

from engine.decoding.attaching import attach_documents
from engine.decoding.text import Message, ToolCall
from engine.documents import Document, DocumentContext


class WordSession:
    """A chat session whose files fit by a budget of words (``ChatSession.documents_context``'s part)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.asked: list[tuple[list[Message], int]] = []

    def documents_context(self, messages, docs, max_tokens: int) -> DocumentContext:
        self.asked.append((list(messages), max_tokens))
        return DocumentContext.build(docs, messages[-1].content, self.budget, lambda text: len(text.split()))


NOTE = Document("note.txt", "text", 24, "The pump resets with reset-7.")


def test_attached_files_go_before_the_last_message_s_words_and_the_rest_is_left_as_it_was():
    session = WordSession(budget=1000)
    earlier = Message("assistant", "", (ToolCall("c1", "f", "{}"),))
    messages = [Message("system", "Be brief."), earlier, Message("user", "How does the pump reset?")]

    placed, context = attach_documents(session, messages, [NOTE], 64)

    assert session.asked == [(messages, 64)]
    assert context.whole and context.coverage == {"note.txt": 1.0}
    assert placed[:2] == messages[:2] and len(placed) == 3
    assert placed[-1].role == "user"
    assert "The pump resets with reset-7." in placed[-1].content
    assert placed[-1].content.endswith("How does the pump reset?")
    assert messages[-1].content == "How does the pump reset?"  # the caller's list is not changed


def test_files_too_large_for_the_room_left_go_in_as_their_passages():
    session = WordSession(budget=12)
    manual = "\n\n".join(f"Section {k}. The valve {k} opens at {k * 10} kPa and closes again." for k in range(40))
    doc = Document("manual.txt", "text", len(manual), manual)

    placed, context = attach_documents(session, [Message("user", "When does valve 7 open?")], [doc], 64)

    assert not context.whole
    assert placed[-1].content.endswith("When does valve 7 open?")
    assert len(placed[-1].content) < len(manual)
