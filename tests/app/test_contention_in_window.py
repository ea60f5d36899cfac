"""The app on a PC where another program is busy: prompt progress, fewer threads said, a measurement put off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from PySide6.QtCore import QElapsedTimer

from app.widgets import measure_status
from app.widgets.chat_pane import WAITING_LINE
from app.widgets.message_bubble import MessageBubble
from engine import GenerationControls, StepEvent
from engine.costs.calibration import MachineBusy
from engine.costs.curve import CostCurve
from engine.decoding.prompt_cache import PREFILL_CHUNK
from engine.llama import native
from engine.tools.busybench import BusyLoop
from tests.helpers.app_fixtures import (
    MODEL_LOAD_TIMEOUT_MS,
    OFFSCREEN_NOISE,
    REPLY_TIMEOUT_MS,
    FakeEngine,
    quick_settings,
    use_fake_engine,
)
from tests.helpers.event_loop import EventLoopWatch

pytestmark = OFFSCREEN_NOISE


class _SlowPromptSession:
    """Reads a 300-token prompt in five visible chunks, then replies with steps run on 1 of 2 threads."""

    total = 300

    def __init__(self, engine) -> None:
        self.engine = engine

    def reply(self, messages, controls: GenerationControls, sampling=None, stop=None, drafts_from=()):
        def events():
            for done in (64, 128, 192, 256, self.total):
                time.sleep(0.15)
                if controls.on_prompt is not None:
                    controls.on_prompt(done, self.total)
            for step in range(6):
                time.sleep(0.05)
                yield StepEvent(
                    step=step, mode="none", token_ids=(1,), text="a", n_committed=1, batch_size=1, n_logits=1,
                    n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0, guesses=0, elapsed_s=0.01,
                    decode_s=0.01, stop_reason="max_tokens" if step == 5 else None, token_texts=("a",),
                    threads=2 if step < 2 else 1, max_threads=2, kept_threads=2 if step < 2 else 1, contended=step >= 2,
                )

        return events()


def test_a_long_prompt_shows_its_progress_and_fewer_threads_are_said_in_the_panel_and_status_bar(
    qtbot, make_window, worker_options, monkeypatch
):
    use_fake_engine(worker_options, _SlowPromptSession)
    lines: list[str] = []
    shown = MessageBubble.set_stats_line

    def recorded(bubble: MessageBubble, text: str) -> None:
        lines.append(text)
        shown(bubble, text)

    monkeypatch.setattr(MessageBubble, "set_stats_line", recorded)
    window = make_window(quick_settings(max_tokens=6))
    status: list[str] = []
    window.statusBar().messageChanged.connect(status.append)
    window.input.setPlainText("a long question")
    with qtbot.waitSignal(window.replyCompleted, timeout=10_000):
        window.send_button.click()
    assert f"{WAITING_LINE} 128 / 300 tokens" in lines
    assert lines.index(f"{WAITING_LINE} 64 / 300 tokens") < lines.index(f"{WAITING_LINE} 256 / 300 tokens")
    assert window.chat_view.bubbles()[-1].text() == "a" * 6
    assert window.panel.live.threads.text() == "1 of 2 (another program is busy)"
    assert status.count("Another program is busy: using 1 of 2 cores") == 1  # said once, not at every step


class _BusyPcEngine(FakeEngine):
    """A model with no cost curve yet, on a PC where another program takes the CPU from every measurement."""

    tunes = 0

    def load_cached_curve(self) -> bool:
        return False

    def tune(self, refresh: bool = False, budget_s: float = 6.0, progress: Callable[[float], None] | None = None,
             cancel: threading.Event | None = None) -> CostCurve:
        type(self).tunes += 1
        if progress is not None:
            progress(0.2)
        raise MachineBusy(max_exact_batch=16)


class _ManualClock:
    """``time`` as measure_status sees it, with a ``monotonic`` that moves only when the test moves it.

    The wait after a busy measurement is kept as a monotonic deadline; with this clock the test says how much
    time passed, so a slow machine (whose reply may take longer than the wait) cannot change the outcome.
    """

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_measurement_stopped_by_a_busy_pc_says_so_and_is_tried_again_later_not_after_every_reply(
    qtbot, make_window, worker_options, monkeypatch
):
    use_fake_engine(worker_options, _SlowPromptSession)
    worker_options["engine_factory"] = _BusyPcEngine
    _BusyPcEngine.tunes = 0
    clock = _ManualClock()
    monkeypatch.setattr(measure_status, "time", clock)
    monkeypatch.setattr(measure_status, "RESUME_AFTER_MS", 100)
    window = make_window(quick_settings(max_tokens=6, auto=True), wait_for_model=False)
    status = window.measure_status
    requested: list[int] = []  # measurements the window asked for, as it asks (on this thread)
    window.engine.measureRequested.connect(requested.append)
    with qtbot.waitSignal(status.message, timeout=MODEL_LOAD_TIMEOUT_MS) as said:
        pass
    assert "Another program is using the CPU" in said.args[0]
    assert status.state == "paused" and not status.isVisible() and _BusyPcEngine.tunes == 1 and len(requested) == 1

    # A reply a second long in between: the quiet time after it is not enough to measure again while the PC
    # may still be busy (RETRY_BUSY_MS, a minute). Forgetting that would start one RESUME_AFTER_MS after it.
    clock.now += 1.0
    window.input.setPlainText("hello")
    with qtbot.waitSignal(window.replyCompleted, timeout=10_000):
        window.send_button.click()
    qtbot.wait(4 * measure_status.RESUME_AFTER_MS)
    assert len(requested) == 1 and _BusyPcEngine.tunes == 1 and status.state == "paused"

    # Once that minute has passed, the quiet time after the next reply measures again.
    clock.now += measure_status.RETRY_BUSY_MS / 1000
    window.input.setPlainText("hello again")
    with qtbot.waitSignal(window.replyCompleted, timeout=10_000):
        window.send_button.click()
    qtbot.waitUntil(lambda: _BusyPcEngine.tunes == 2, timeout=5_000)
    assert len(requested) == 2


@pytest.mark.model
@pytest.mark.timing
def test_a_1000_token_prompt_beside_a_busy_program_shows_progress_after_its_first_chunk_and_never_freezes(
    qtbot, make_window, monkeypatch
):
    """Real time, measured as the parts the app controls: the model's decodes take what this PC gives them.

    The window probes and measures this PC when the model loads (a fresh home has no curve) and reads the chat
    ahead; Send stops all of that before its next decode, so the first progress comes right after the prompt's
    first chunk, with at most one such decode under way before it. What the app adds around them
    (saving the message, queueing, the template, tokenizing a 1000-token message) must stay well under half a
    second.
    """
    decodes: list[tuple[float, float, int]] = []  # (start, end, tokens) on the clock below, on any thread
    decoding_threads: set[threading.Thread] = set()
    real_decode = native.Context.decode

    def timed_decode(ctx: native.Context, batch: native.Batch) -> None:
        decoding_threads.add(threading.current_thread())
        t0 = clock.elapsed()
        real_decode(ctx, batch)
        decodes.append((t0 / 1000, clock.elapsed() / 1000, batch.n_tokens))

    clock = QElapsedTimer()
    clock.start()
    monkeypatch.setattr(native.Context, "decode", timed_decode)
    # The engine picks its threads (two here, on a 2-core machine), as it does for a user.
    window = make_window(quick_settings(threads=0, n_ctx=2048, max_tokens=4, lookahead_on=False))
    words = " ".join(f"w{i}" for i in range(280))  # ~1050 tokens
    window.input.setPlainText(f"Repeat the last word of this list: {words}")
    progress: list[tuple[float, int, int]] = []
    window.engine.worker.promptProgress.connect(
        lambda _id, done, total: progress.append((clock.elapsed() / 1000, done, total))
    )
    watch = EventLoopWatch()
    interrupted: list[float] = []  # when Send stopped the measurement (emitted on the GUI thread)
    window.engine.measureInterruptRequested.connect(lambda _id: interrupted.append(clock.elapsed() / 1000))
    with BusyLoop():
        clicked = clock.elapsed() / 1000
        watch.start()
        # Only a guard against a hang: until this PC is measured the engine keeps both threads, and a chunk whose
        # second thread shares its core with the busy program can take seconds (the threads wait for each other at
        # every layer), so the whole prompt may take minutes on a loaded CI machine.
        with qtbot.waitSignal(window.replyCompleted, timeout=5 * REPLY_TIMEOUT_MS) as blocker:
            window.send_button.click()
        watch.stop()
    record = blocker.args[0]
    assert record.outcome.stop_reason == "max_tokens"
    total = progress[-1][2]
    assert total >= 1000 and progress[-1][1] == total
    first_at, first_done, _ = progress[0]
    assert first_done == PREFILL_CHUNK
    stopped = interrupted[0] if interrupted else clicked
    before_first = [d for d in decodes if clicked < d[1] <= first_at]
    started_after_stop = [d for d in before_first if d[0] >= stopped]
    assert [n for _, _, n in started_after_stop] == [PREFILL_CHUNK], before_first  # only the first chunk
    assert len([d for d in before_first if d[0] < stopped < d[1]]) <= 1, before_first  # one measurement decode
    in_decodes = sum(end - max(start, clicked) for start, end, _ in before_first)
    overhead = first_at - clicked - in_decodes
    assert overhead < 0.5, f"first progress {first_at - clicked:.2f} s after Send, {overhead:.2f} s of it not decoding"
    assert decoding_threads and threading.main_thread() not in decoding_threads  # the GUI thread never decodes
    watch.assert_kept_running()  # real time: see tests/helpers/event_loop.py


def test_the_threads_row_tells_a_kept_reduction_from_a_trial():
    from dataclasses import replace

    from app.widgets.stats_view import threads_text

    step = StepEvent(step=1, mode="plain", token_ids=(1,), text="a", n_committed=1, batch_size=1, n_logits=1,
                     n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0, guesses=0, elapsed_s=0.01,
                     decode_s=0.01, threads=2, max_threads=2, kept_threads=2)
    assert threads_text(step) == "2"
    assert threads_text(replace(step, threads=1, kept_threads=1)) == "1 of 2 (another program is busy)"
    assert threads_text(replace(step, threads=1)) == "1 of 2 (trying fewer: the cores are busy)"
    assert threads_text(replace(step, threads=2, kept_threads=1)) == "2 of 2 (trying more: a core may be free)"
    assert threads_text(replace(step, threads=1, kept_threads=0)) == "1 of 2 (another program is busy)"  # stored
