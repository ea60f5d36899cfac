"""Files attached to a message, on the data side: saved with it, placed in its prompt by the worker, sent again
in later turns exactly as the model first read them, drafted from, and kept through regenerate, edit, fork,
restart and backup.

The window runs on a fake engine whose session places files with the real ``DocumentContext`` (counting words as
tokens) and replies "Reply 1.", "Reply 2.", … at once, so these tests load no model.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest
from PySide6.QtCore import QObject, Slot

from app.attachments import Attachment, ReplySources, as_the_model_read_it
from app.backup import export_json, import_json
from app.chat_controller import ChatController, RequestIds, TurnSettings
from app.chat_runner import READING_NOTICE
from app.engine_thread import EngineThread
from app.requests import DocumentsPlaced, GenerationRequest
from app.settings import AppSettings
from app.store import ChatStore
from engine import GenerationControls, Message, SamplingConfig, StepEvent, StopConfig
from engine.documents import DocumentContext, with_documents
from tests.helpers import app_fixtures
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, FakeEngineEarlierChats, quick_settings, use_fake_engine
from tests.helpers.optional import present

pytestmark = OFFSCREEN_NOISE

TIMEOUT_MS = 10_000
send = partial(app_fixtures.send, timeout_ms=TIMEOUT_MS)
click_and_wait = partial(app_fixtures.click_and_wait, timeout_ms=TIMEOUT_MS)
OWLS = Attachment("owls.md", "markdown", 120, "# Owls\n\nOwls swallow small prey whole and cough up pellets.\n",
                  path="/notes/owls.md")
PREY = Attachment("prey.csv", "csv", 30, "animal,share\nvole,60\nmouse,30\n")
_BOOK_TEXT = "# Owls\n\n" + "\n\n".join(
    f"Owls of kind {k} swallow small prey whole and later cough up pellets of fur and bone." for k in range(40))
BOOK = Attachment("book.md", "markdown", len(_BOOK_TEXT), _BOOK_TEXT)  # four passages, too long to go in whole


class _FilesSession:
    """Places files as the real session does (word counts for tokens) and replies "Reply n." a word a step.

    Keeps every conversation it was asked to answer (without the system prompt), the files it was asked to place,
    and what the engine drafted from when each reply began.
    """

    asked: list[list[Message]] = []
    placed: list[list[str]] = []
    drafting_from: list[tuple[str, ...]] = []
    budget = 10_000  # tokens the files may take (small: passages only)
    replies = 0

    def __init__(self, engine) -> None:
        self.engine = engine

    def documents_context(self, messages, docs, max_tokens: int) -> DocumentContext:
        _FilesSession.placed.append([d.name for d in docs])
        return DocumentContext.build(docs, messages[-1].content, self.budget, lambda text: len(text.split()))

    def reply(self, messages, controls: GenerationControls, sampling=None, stop=None, drafts_from=()):
        _FilesSession.replies += 1
        _FilesSession.asked.append([m for m in messages if m.role != "system"])  # the window's default prompt
        _FilesSession.drafting_from.append(self.engine.document_texts)
        words = ["Reply", f" {_FilesSession.replies}", "."]
        return iter([_step(k, word, "eog" if k == len(words) - 1 else None) for k, word in enumerate(words)])


def _step(step: int, word: str, reason: str | None) -> StepEvent:
    return StepEvent(
        step=step, mode="plain", token_ids=(step + 1,), text=word, n_committed=1, batch_size=1, n_logits=1,
        n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0, guesses=0, elapsed_s=0.001, decode_s=0.001,
        stop_reason=reason, token_texts=(word,), token_sources=("own",),
    )


class WorkerAnswers(QObject):
    """What the worker said, in order, received on the GUI thread as the window receives it."""

    def __init__(self, worker) -> None:
        super().__init__()
        self.said: list[tuple[str, object]] = []
        worker.replyStarted.connect(self._on_started)
        worker.documentsPlaced.connect(self._on_placed)
        worker.stepUpdate.connect(self._on_step)
        worker.replyFinished.connect(self._on_finished)

    @Slot(int)
    def _on_started(self, request_id: int) -> None:
        self.said.append(("started", request_id))

    @Slot(object)
    def _on_placed(self, placed: object) -> None:
        self.said.append(("placed", placed))

    @Slot(object)
    def _on_step(self, update: object) -> None:
        self.said.append(("step", update))

    @Slot(object)
    def _on_finished(self, outcome: object) -> None:
        self.said.append(("finished", outcome))


@pytest.fixture
def files_engine(worker_options):
    _FilesSession.asked, _FilesSession.placed, _FilesSession.drafting_from = [], [], []
    _FilesSession.budget, _FilesSession.replies = 10_000, 0
    use_fake_engine(worker_options, _FilesSession)


def counted(attachment: Attachment) -> Attachment:
    """The file as saved once the worker placed it: its tokens counted (the fake engine counts words)."""
    return replace(attachment, tokens=len(attachment.text.split()))


def _user_messages(store: ChatStore, conversation_id: int):
    return [m for m in store.messages(conversation_id) if m.role == "user"]


# --- the worker ---


def test_the_worker_places_the_files_before_the_message_and_says_what_it_placed_before_the_first_step(
    qtbot, files_engine, worker_options
):
    thread = EngineThread(**worker_options)
    answers = WorkerAnswers(thread.worker)
    try:
        thread.loadRequested.emit("", 1024, 1)
        qtbot.waitUntil(lambda: thread.worker._engine is not None, timeout=TIMEOUT_MS)
        _FilesSession.budget = 400  # room for a passage of the book only
        question = "What do owls cough up?"
        request = GenerationRequest(7, (Message("user", question),), None, SamplingConfig(), StopConfig(max_tokens=16),
                                    attachments=(BOOK, PREY), documents=(OWLS.text, BOOK.text, PREY.text))
        thread.generateRequested.emit(request)
        qtbot.waitUntil(lambda: bool(answers.said) and answers.said[-1][0] == "finished", timeout=TIMEOUT_MS)
        engine = thread.worker._engine
        assert isinstance(engine, FakeEngineEarlierChats)
    finally:
        assert thread.shutdown()

    assert [kind for kind, _ in answers.said] == ["started", "placed", "step", "step", "step", "finished"]
    placed = answers.said[1][1]
    assert isinstance(placed, DocumentsPlaced) and placed.request_id == 7
    expected = DocumentContext.build([BOOK.document(), PREY.document()], question, 400, lambda t: len(t.split()))
    assert not expected.whole and 0 < expected.coverage["book.md"] < 1  # passages: what fits, not whole files
    assert placed.text == expected.text == placed.sources.text
    assert placed.sources == ReplySources.of_context(expected)
    assert placed.tokens == {"book.md": len(BOOK.text.split()), "prey.csv": len(PREY.text.split())}  # whole files
    assert _FilesSession.asked == [[Message("user", with_documents(question, expected))]]
    # Drafts come from the whole text of every file on the branch, not only what was placed.
    assert _FilesSession.drafting_from == [(OWLS.text, BOOK.text, PREY.text)]
    # The earlier-chats memory keeps what the person wrote and the reply, not the files' text.
    assert engine.remembered == [FakeEngineEarlierChats().tokenize(question + "\n") + [1, 2, 3]]


# --- sending, later turns, regenerate, edit, fork ---


def test_a_message_with_files_is_saved_with_them_and_the_next_turn_sends_them_as_the_model_first_read_them(
    qtbot, make_window, files_engine
):
    window = make_window(quick_settings())
    first = send(qtbot, window, "What do owls eat?", (OWLS, PREY))
    assert window.chat_pane.pending_attachments() == ()  # the files left the box with the message

    store = window.store
    (question,) = _user_messages(store, first.conversation_id)
    assert question.content == "What do owls eat?"
    assert question.attachments == (counted(OWLS), counted(PREY))
    placed = question.documents
    assert placed is not None and placed.whole and placed.coverage == {"owls.md": 1.0, "prey.csv": 1.0}
    model_read = _FilesSession.asked[0][-1].content
    assert model_read == as_the_model_read_it(question.content, placed) != question.content
    assert OWLS.text.strip() in model_read

    send(qtbot, window, "And what is a pellet?")
    assert _FilesSession.placed == [["owls.md", "prey.csv"]]  # placed once, when sent
    later = _FilesSession.asked[1]
    assert [(m.role, m.content) for m in later] == [("user", model_read), ("assistant", first.text),
                                                   ("user", "And what is a pellet?")]
    assert _FilesSession.drafting_from[1] == (OWLS.text, PREY.text)
    bubbles = window.chat_view.bubbles()
    assert bubbles[0].attachment_chips is not None and bubbles[1].sources_section is not None


def test_files_and_what_the_model_read_of_them_survive_a_restart(qtbot, make_window, files_engine):
    window = make_window(quick_settings())
    first = send(qtbot, window, "Summarise my notes.", (OWLS,))
    model_read = _FilesSession.asked[0][-1].content
    window.close()

    store = ChatStore()
    (question,) = _user_messages(store, first.conversation_id)
    assert question.attachments[0].text == OWLS.text and question.documents.text in model_read
    store.close()
    again = make_window(AppSettings.load())
    assert again.current_conversation_id() == first.conversation_id
    send(qtbot, again, "Shorter, please.")
    assert _FilesSession.asked[-1][0].content == model_read
    assert _FilesSession.drafting_from[-1] == (OWLS.text,)


def test_a_regenerated_reply_answers_the_same_message_with_its_files_without_placing_them_again(
    qtbot, make_window, files_engine
):
    window = make_window(quick_settings())
    send(qtbot, window, "What do owls eat?", (OWLS,))
    model_read = _FilesSession.asked[0][-1].content
    second = click_and_wait(qtbot, window, window.chat_view.bubbles()[-1].regenerate_button)
    assert second.text == "Reply 2."
    assert _FilesSession.placed == [["owls.md"]]
    assert _FilesSession.asked[1] == _FilesSession.asked[0]  # the same prompt: the cache is reused
    assert _FilesSession.drafting_from[1] == (OWLS.text,)
    assert len(_user_messages(window.store, second.conversation_id)) == 1
    assert window.chat_view.bubbles()[-1].sources_section is not None  # the new reply shows the same sources
    engine = window.engine.worker._engine
    question = FakeEngineEarlierChats().tokenize("What do owls eat?\n")
    assert engine.remembered[-1] == question + [1, 2, 3]  # the person's words, not the files'
    assert model_read != "What do owls eat?"


def test_editing_a_message_puts_its_files_back_and_the_edited_message_keeps_them(qtbot, make_window, files_engine):
    window = make_window(quick_settings())
    first = send(qtbot, window, "What do owls eat?", (OWLS, PREY))
    (question,) = _user_messages(window.store, first.conversation_id)
    window.chat_view.bubble_for(question.id).edit_button.click()
    assert window.chat_pane.pending_attachments() == question.attachments
    window.chat_pane.set_attachments(question.attachments[:1])  # the person removes one file

    window.input.setPlainText("What do owls hunt?")
    with qtbot.waitSignal(window.replyCompleted, timeout=TIMEOUT_MS):
        window.send_button.click()
    edited = window.store.messages(first.conversation_id)[0]
    assert edited.id != question.id and window.store.siblings(edited.id) == [question.id, edited.id]
    assert [a.name for a in edited.attachments] == ["owls.md"] and edited.documents.coverage == {"owls.md": 1.0}
    assert _FilesSession.placed == [["owls.md", "prey.csv"], ["owls.md"]]
    assert _FilesSession.drafting_from[-1] == (OWLS.text,)  # the old branch's other file is not drafted from


def test_a_fork_keeps_the_files_and_goes_on_from_them(qtbot, make_window, files_engine):
    window = make_window(quick_settings())
    first = send(qtbot, window, "What do owls eat?", (OWLS,))
    model_read = _FilesSession.asked[0][-1].content
    window.chat_view.bubble_for(first.message_id).fork_button.click()
    fork = window.current_conversation_id()
    assert fork != first.conversation_id
    (copied,) = _user_messages(window.store, fork)
    assert copied.attachments[0].text == OWLS.text and copied.documents is not None

    send(qtbot, window, "Tell me more.")
    assert _FilesSession.asked[-1][0].content == model_read
    assert _FilesSession.drafting_from[-1] == (OWLS.text,)


def test_a_chat_without_files_never_drafts_from_another_chats_files(qtbot, make_window, files_engine):
    window = make_window(quick_settings())
    send(qtbot, window, "What do owls eat?", (OWLS,))
    owls_chat = window.current_conversation_id()
    assert window.chat_pane.context_meter.documents == {"owls.md": 1.0}  # the meter says what of it the model sees
    window.new_chat()
    assert window.chat_pane.context_meter.documents == {}
    send(qtbot, window, "Hello there.")
    assert _FilesSession.drafting_from == [(OWLS.text,), ()]
    assert _FilesSession.asked[-1] == [Message("user", "Hello there.")]
    assert window.chat_pane.context_meter.documents == {}
    window.runner.show_conversation(owls_chat)
    assert window.chat_pane.context_meter.documents == {"owls.md": 1.0}


def test_a_message_sent_while_its_files_are_still_being_read_is_refused_and_the_text_kept(
    qtbot, make_window, files_engine, monkeypatch
):
    window = make_window(quick_settings())
    pane = window.chat_pane
    monkeypatch.setattr(pane, "is_reading_attachments", lambda: True)  # a file still on its way in
    window.input.setPlainText("What is in this file?")
    window.send_button.click()
    assert window.input.toPlainText() == "What is in this file?"
    assert window.statusBar().currentMessage() == READING_NOTICE
    assert not window.is_busy() and window.store.conversations() == [] and _FilesSession.asked == []

    monkeypatch.setattr(pane, "is_reading_attachments", lambda: False)  # read now
    pane.set_attachments((OWLS,))
    with qtbot.waitSignal(window.replyCompleted, timeout=TIMEOUT_MS) as blocker:
        window.send_button.click()
    (question,) = _user_messages(window.store, blocker.args[0].conversation_id)
    assert question.content == "What is in this file?" and question.attachments == (counted(OWLS),)


def test_a_message_that_is_only_files_is_sent_and_names_its_chat_after_the_first(qtbot, make_window, files_engine):
    window = make_window(quick_settings())
    record = send(qtbot, window, "", (PREY,))
    assert window.store.conversation(record.conversation_id).title == "prey.csv"
    (question,) = _user_messages(window.store, record.conversation_id)
    assert question.content == "" and question.attachments == (counted(PREY),)
    assert PREY.text.strip() in _FilesSession.asked[0][-1].content


# --- without Qt ---


def _settings() -> TurnSettings:
    return TurnSettings("", None, SamplingConfig(), StopConfig())


def test_a_message_saved_with_files_the_worker_never_placed_gets_them_placed_when_regenerated():
    store = ChatStore(":memory:")
    conv = store.create_conversation("Owls")
    question = store.add_message(conv.id, "user", "What do owls eat?", attachments=[OWLS])  # the app stopped here
    chat = ChatController(store, RequestIds())
    chat.conversation_id = conv.id
    started = chat.turns.begin_regenerate(_settings())
    assert started is not None
    turn, request = started
    assert request.attachments == (OWLS,) and request.messages[-1].content == "What do owls eat?"
    assert chat.turns.accept(request.request_id) is turn and turn.reply_parent == question.id
    context = DocumentContext.build([OWLS.document()], "What do owls eat?", 100, lambda t: len(t.split()))
    chat.turns.place_documents(DocumentsPlaced(request.request_id, ReplySources.of_context(context), context.text,
                                               {"owls.md": 11}))
    saved = present(store.message(question.id))
    assert saved.documents == ReplySources.of_context(context) and saved.attachments[0].tokens == 11

    _again, next_request = present(chat.turns.begin_regenerate(_settings()))
    assert next_request.attachments == () and next_request.user_words == "What do owls eat?"
    assert next_request.messages[-1].content == with_documents("What do owls eat?", context)


def test_what_the_model_was_given_stored_before_its_text_was_kept_still_loads_and_sends_the_message_alone():
    old = json.dumps({"citations": [{"name": "a.txt", "where": "line 1", "text": "x"}], "coverage": {"a.txt": 1.0},
                      "whole": True})
    sources = ReplySources.from_json(old)
    assert sources is not None and sources.text == "" and sources.coverage == {"a.txt": 1.0}
    assert as_the_model_read_it("question", sources) == "question"
    assert as_the_model_read_it("question", None) == "question"
    assert ReplySources.from_json(sources.to_json()) == sources


def test_a_chat_with_files_round_trips_through_a_json_backup():
    source = ChatStore(":memory:")
    conv = source.create_conversation("Owls")
    question = source.add_message(conv.id, "user", "What do owls eat?", attachments=[OWLS, PREY])
    context = DocumentContext.build([OWLS.document(), PREY.document()], "owls", 10, lambda t: len(t.split()))
    source.set_placed_documents(question.id, ReplySources.of_context(context))
    source.add_message(conv.id, "assistant", "Voles.")
    target = ChatStore(":memory:")
    (copy,) = import_json(target, export_json(source))
    (imported,) = _user_messages(target, copy.id)
    assert imported.attachments == (OWLS, PREY)
    assert imported.documents == ReplySources.of_context(context) and not imported.documents.whole
