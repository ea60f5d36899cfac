"""Stop and close at the app's default settings: Stop ends a reply within one step, closing within 2 s."""

from __future__ import annotations

import time

import pytest

from app.settings import AppSettings  # noqa: E402
from app.stats import ReplyStats  # noqa: E402
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, OFFSCREEN_NOISE, REPLY_TIMEOUT_MS, close_mid_reply
from tests.helpers.optional import present

pytestmark = [pytest.mark.model, OFFSCREEN_NOISE]

LONG_PROMPT = "Write a long story about a dragon who learns to fly."
STOP_LIMIT_S = 0.2


@pytest.mark.timing
def test_stop_at_the_default_settings_ends_the_reply_within_200_ms(qtbot, make_window):
    window = make_window(AppSettings())  # the defaults: Auto lookahead, all cores, 512 tokens
    latencies: list[float] = []
    finished: list[float] = []
    # Connected without a receiver: called as the worker emits (or as soon as the GUI thread gets it).
    window.engine.worker.replyFinished.connect(lambda _o: finished.append(time.perf_counter()))
    for attempt in range(3):
        pressed: list[float] = []

        def press_stop_on_third_step(update, pressed: list[float] = pressed) -> None:
            if not pressed and update.event.step >= 2:
                pressed.append(time.perf_counter())
                window.send_button.click()

        window.replyStepReceived.connect(press_stop_on_third_step)
        window.input.setPlainText(f"{LONG_PROMPT} ({attempt})")
        with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
            window.send_button.click()
        window.replyStepReceived.disconnect(press_stop_on_third_step)
        record = blocker.args[0]
        assert record.outcome.stop_reason == "cancelled"
        assert record.outcome.steps_after_stop <= 1
        latencies.append(finished[-1] - pressed[0])
    # The best of three: a loaded CI machine may stall one of them; the check is that Stop is honoured at
    # the next step boundary, not after the whole reply (which would take seconds here).
    print(f"stop -> finished: {', '.join(f'{x * 1000:.0f} ms' for x in latencies)}")
    assert min(latencies) < STOP_LIMIT_S, latencies


@pytest.mark.timing
def test_closing_mid_reply_at_the_default_settings_exits_quickly_and_saves_the_partial_reply(qtbot, make_window):
    window = make_window(AppSettings())
    texts: list[str] = []
    window.replyStepReceived.connect(lambda u: texts.append(u.event.text))
    window.input.setPlainText(LONG_PROMPT)
    window.send_button.click()
    qtbot.waitUntil(lambda: sum(1 for t in texts if t) >= 3, timeout=REPLY_TIMEOUT_MS)

    messages = close_mid_reply(window)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == "".join(texts)  # everything that was streamed, nothing more or less
    assert present(ReplyStats.from_stats_json(messages[1].stats_json)).stop_reason == "cancelled"


@pytest.mark.timing
def test_closing_while_a_model_loads_exits_quickly(qtbot, make_window):
    window = make_window(AppSettings(), wait_for_model=False)
    qtbot.waitUntil(window.is_loading, timeout=MODEL_LOAD_TIMEOUT_MS)
    t0 = time.perf_counter()
    window.close()
    assert time.perf_counter() - t0 < 2.0
    assert not window.engine.worker_thread.isRunning()


LOOPING_PROMPT = "Make a Markdown table of four planets with their diameter and number of moons."


def test_a_reply_stopped_for_repeating_itself_can_be_written_out_anyway(qtbot, make_window):
    """The loop guard stops the reply and says so; "Write it out" writes it again without the guard: the same text
    up to the stop, then on, and the stopped reply stays as an alternative."""
    from tests.helpers.app_fixtures import click_and_wait, quick_settings, send

    window = make_window(quick_settings(max_tokens=160))
    stopped = send(qtbot, window, LOOPING_PROMPT)
    assert stopped.outcome.stop_reason == "loop", stopped.text
    bubble = window.chat_view.bubbles()[-1]
    assert "repeating itself" in bubble.stats_label.text()
    assert bubble.write_out_button.isVisibleTo(window) and not bubble.regenerate_button.isHidden()
    whole = click_and_wait(qtbot, window, bubble.write_out_button)
    assert whole.outcome.stop_reason != "loop"
    assert whole.text.startswith(stopped.text) and len(whole.text) > len(stopped.text)
    last = window.chat_view.bubbles()[-1]
    assert len(last.alternatives) == 2 and not last.write_out_button.isVisibleTo(window)
    assert window.panel.stop_config().loop_guard  # this once: the panel's switch stays on
