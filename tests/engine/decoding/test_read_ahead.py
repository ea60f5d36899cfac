"""Reading the next prompt's start while the user writes, prompt chunks at fixed positions, the thread probe."""

from __future__ import annotations

import threading

import pytest

from engine import ChatSession, Message, StopConfig
from engine.costs.calibration import MeasurementCancelled
from engine.decoding.prompt_cache import PREFILL_CHUNK
from engine.decoding.runtime import Engine
from engine.documents import Document
from engine.llama import native

pytestmark = pytest.mark.model

HISTORY = [
    Message("system", "You are a helpful assistant."),
    Message("user", "Name three rivers of Europe and say one thing about each."),
    Message("assistant", "The Danube flows through ten countries. The Rhine carries barges from Switzerland to the "
                         "North Sea. The Loire is the longest river that lies wholly in France."),
]
MANUAL = "\n".join(
    f"Section {k}. The pump checks its pressure every {k + 2} minutes and logs a warning when it drops below "
    f"{k * 3 + 10} kPa. Operators reset the counter with the command reset-{k}."
    for k in range(1, 30)
)
MANUAL_DOC = Document("manual.txt", "text", len(MANUAL), MANUAL)
QUESTION = "Which command resets the counter of section 7?"


def reply_of(session: ChatSession, messages: list[Message]) -> tuple[str, int]:
    """The greedy reply's text (24 tokens) and how many prompt tokens it read before its first step."""
    events = list(session.reply(messages, stop=StopConfig(max_tokens=24)))
    return "".join(e.text for e in events), events[0].prefill_tokens


def with_manual(session: ChatSession, question: str) -> list[Message]:
    """The history and a new message carrying the manual, as the app sends a message with a file attached."""
    from engine.documents import with_documents

    messages = [*HISTORY, Message("user", question)]
    context = session.documents_context(messages, [MANUAL_DOC], 512)
    messages[-1] = Message("user", with_documents(question, context))
    return messages


def test_what_is_read_ahead_leaves_send_only_the_question_and_the_reply_is_the_same(engine: Engine):
    session = ChatSession(engine)
    messages = with_manual(session, QUESTION)
    engine.reset()
    plain_text, read_at_send = reply_of(session, messages)
    assert read_at_send > 10 * PREFILL_CHUNK  # the manual: worth reading ahead

    engine.reset()
    read = session.read_ahead(HISTORY, [MANUAL_DOC], 512)
    assert read > 9 * PREFILL_CHUNK and engine.kv.n % PREFILL_CHUNK == 0  # whole chunks only
    assert session.read_ahead(HISTORY, [MANUAL_DOC], 512) == 0  # nothing left to read
    text, read_at_send = reply_of(session, messages)
    question_tokens = len(engine.tokenize(QUESTION, add_special=False))
    assert read_at_send <= PREFILL_CHUNK + question_tokens + 16  # the last partial chunk, the question, markers
    assert text == plain_text  # the prompt's cache is the same however it was read


def test_a_read_ahead_stops_between_chunks_when_cancelled_and_keeps_what_it_read(engine: Engine, monkeypatch):
    session = ChatSession(engine)
    cancel = threading.Event()
    real_decode = native.Context.decode

    def cancel_after_two(ctx: native.Context, batch: native.Batch) -> None:
        real_decode(ctx, batch)
        if engine.kv.n + batch.n_tokens >= 2 * PREFILL_CHUNK:
            cancel.set()  # as Send does, from the GUI thread, while a chunk is read

    monkeypatch.setattr(native.Context, "decode", cancel_after_two)
    engine.reset()
    read = session.read_ahead(HISTORY, [MANUAL_DOC], 512, cancel=cancel)
    assert read == engine.kv.n == 2 * PREFILL_CHUNK
    monkeypatch.setattr(native.Context, "decode", real_decode)
    rest = session.read_ahead(HISTORY, [MANUAL_DOC], 512)  # goes on where it stopped
    assert rest > 0 and engine.kv.n == 2 * PREFILL_CHUNK + rest


def test_a_read_ahead_uses_one_thread_fewer_and_gives_the_threads_back(engine: Engine, monkeypatch):
    threads_seen: list[int] = []
    real_decode = native.Context.decode

    def note_threads(ctx: native.Context, batch: native.Batch) -> None:
        threads_seen.append(ctx.n_threads)
        real_decode(ctx, batch)

    monkeypatch.setattr(native.Context, "decode", note_threads)
    engine.reset()
    before = engine.ctx.n_threads
    assert ChatSession(engine).read_ahead(HISTORY, [MANUAL_DOC], 512) > 0
    assert set(threads_seen) == {max(1, engine.n_threads - 1)}
    assert engine.ctx.n_threads == before


def test_prompt_chunks_end_at_fixed_positions_whatever_the_cache_held(engine: Engine, monkeypatch):
    sizes: list[tuple[int, int]] = []  # (first position, tokens) of every decode
    real_decode = native.Context.decode

    def note(ctx: native.Context, batch: native.Batch) -> None:
        sizes.append((int(batch.pos[0]), batch.n_tokens))
        real_decode(ctx, batch)

    tokens = engine.tokenize(MANUAL)
    engine.reset()
    engine.cache.prefill(tokens[:100])
    monkeypatch.setattr(native.Context, "decode", note)
    engine.cache.prefill(tokens[100:400])
    assert sizes[0] == (100, 2 * PREFILL_CHUNK - 100)
    assert all(pos % PREFILL_CHUNK == 0 for pos, _ in sizes[1:])
    assert sum(n for _, n in sizes) == 300


def test_the_thread_probe_finds_whether_the_count_may_change_and_turns_the_governor_on(model_path, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))  # no cached curve tells it
    with Engine(model_path, n_ctx=1024) as eng:  # threads picked from this PC, as the app does
        assert eng.costs.threads_agree is None and not eng.governor.adapt
        chat = eng.render_chat(HISTORY)
        eng.cache.prefill(chat)  # what the chat read ahead left: the probe must keep it
        cancel = threading.Event()
        cancel.set()
        if eng.n_threads > 1:
            with pytest.raises(MeasurementCancelled):
                eng.probe_threads(cancel)
            assert eng.costs.threads_agree is None
        assert eng.probe_threads()
        assert eng.costs.threads_agree is not None
        assert eng.governor.adapt == (eng.costs.threads_agree and eng.n_threads > 1)
        assert eng.kv.tokens == chat


def test_measuring_keeps_what_the_cache_held_and_the_reply_after_it_is_the_same(engine: Engine):
    session = ChatSession(engine)
    messages = [*HISTORY, Message("user", QUESTION)]
    engine.reset()
    fresh_text, _ = reply_of(session, messages)
    engine.reset()
    session.read_ahead(HISTORY)
    held = list(engine.kv.tokens)
    assert held
    with engine.cache.cache_kept():  # what a measurement does inside: its own prompt from an empty cache
        engine.reset()
        engine.cache.prefill(engine.tokenize(MANUAL)[:300])
    assert engine.kv.tokens == held
    assert engine.cache_positions() == {s: (0, len(held) - 1) for s in engine.loaded.commit_seqs}
    text, read_at_send = reply_of(session, messages)
    assert read_at_send < len(engine.tokenize(QUESTION, add_special=False)) + PREFILL_CHUNK
    assert text == fresh_text
