"""A message with an attached file, answered by the bundled model through the app's worker: the file is placed in
the prompt and the reply drafts from it."""

from __future__ import annotations

import pytest

from app.attachments import Attachment
from app.engine_thread import EngineThread
from app.requests import DocumentsPlaced, GenerationRequest, StepUpdate
from engine import Message, RunStats, SamplingConfig, StopConfig
from engine.decoding.settings import DEFAULT_LOOKAHEAD
from tests.app.test_attachments_data import WorkerAnswers
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS
from tests.helpers.optional import present
from tests.helpers.planning import FLAT, auto_on_curve

pytestmark = pytest.mark.model

QUESTION = "Describe how a bicycle's gears work, step by step."


def _ask(qtbot, thread: EngineThread, answers: WorkerAnswers, request: GenerationRequest) -> list[tuple[str, object]]:
    """What the worker said about ``request``, once it finished."""
    start = len(answers.said)
    thread.generateRequested.emit(request)
    qtbot.waitUntil(lambda: len(answers.said) > start and answers.said[-1][0] == "finished", timeout=REPLY_TIMEOUT_MS)
    return answers.said[start:]


def test_a_reply_to_a_message_with_an_attached_file_drafts_from_the_file(qtbot, app_home, worker_options):
    thread = EngineThread(**worker_options)
    answers = WorkerAnswers(thread.worker)
    try:
        thread.loadRequested.emit("", 2048, 1)
        qtbot.waitUntil(lambda: thread.worker._engine is not None, timeout=MODEL_LOAD_TIMEOUT_MS)
        engine = present(thread.worker._engine)
        engine.corpus = engine.kept = None  # no drafts from earlier chats or kept n-grams: the file's alone
        stop = StopConfig(max_tokens=64)
        plain = _ask(qtbot, thread, answers, GenerationRequest(1, (Message("user", QUESTION),), None,
                                                               SamplingConfig(), stop))
        reply = "".join(u.event.text for kind, u in plain if kind == "step" and isinstance(u, StepUpdate))
        assert reply.strip()
        # A file that holds the answer, as a manual would.
        text = f"Notes from the workshop.\n\n{reply}\n\nEnd of notes.\n"
        notes = Attachment("workshop.txt", "text", len(text.encode()), text)
        with auto_on_curve(engine, FLAT):  # Auto drafts whatever this CPU makes worth it
            said = _ask(qtbot, thread, answers, GenerationRequest(
                2, (Message("user", QUESTION),), DEFAULT_LOOKAHEAD, SamplingConfig(), stop,
                attachments=(notes,), documents=(notes.text,)))
    finally:
        assert thread.shutdown()

    kinds = [kind for kind, _ in said]
    assert kinds[:2] == ["started", "placed"] and kinds[-1] == "finished"
    placed = said[1][1]
    assert isinstance(placed, DocumentsPlaced) and placed.sources.coverage == {"workshop.txt": 1.0}
    assert reply.strip() in placed.text and placed.tokens["workshop.txt"] > 10
    stats = RunStats.of(u.event for kind, u in said if kind == "step" and isinstance(u, StepUpdate))
    assert stats.accepted_by_source.get("document", 0) > 20, stats.accepted_by_source
