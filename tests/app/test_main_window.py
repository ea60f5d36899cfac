"""The main window with the bundled model: send, stream, stop, change lookahead mid-reply, persist, fail well."""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import Qt  # noqa: E402 (after the offscreen platform is set)

from app.main_window import ReplyRecord  # noqa: E402
from app.requests import GenerationRequest, StepUpdate
from app.settings import AppSettings  # noqa: E402
from app.stats import ReplyStats  # noqa: E402
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, REPLY_TIMEOUT_MS, close_mid_reply, quick_settings, send
from tests.helpers.optional import present

pytestmark = [pytest.mark.model, OFFSCREEN_NOISE]

LONG_PROMPT = "Write a long story about a dragon who learns to fly."


def test_a_message_typed_and_sent_with_enter_gets_a_streamed_reply(qtbot, make_window):
    window = make_window()
    updates: list[StepUpdate] = []
    window.replyStepReceived.connect(updates.append)
    qtbot.keyClicks(window.input, "Name three colours.")
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(window.input, Qt.Key.Key_Return)
    record: ReplyRecord = blocker.args[0]

    assert record.text.strip()
    assert sum(1 for u in updates if u.event.token_ids) >= 2, "the reply arrived in one piece, not streamed"
    assert "".join(u.event.text for u in updates) == record.text
    assert window.input.toPlainText() == ""
    bubbles = window.chat_view.bubbles()
    assert [b.role for b in bubbles] == ["user", "assistant"]
    assert bubbles[0].text() == "Name three colours."
    assert bubbles[1].text() == record.text
    assert "tok/s" in bubbles[1].stats_label.text() and "TTFT" in bubbles[1].stats_label.text()
    stored = window.store.messages(record.conversation_id)
    assert [(m.role, m.content) for m in stored] == [("user", "Name three colours."), ("assistant", record.text)]
    assert present(ReplyStats.from_stats_json(stored[1].stats_json)).n_tokens == record.stats.n_tokens > 0
    assert window.panel.live.chart.values() == record.stats.per_step


def test_stop_ends_the_reply_within_one_step(qtbot, make_window):
    window = make_window(quick_settings(max_tokens=48))
    pressed: list[bool] = []

    def press_stop_on_first_step(_update) -> None:
        if not pressed:
            pressed.append(True)
            assert window.send_button.text() == "Stop"
            window.send_button.click()

    window.replyStepReceived.connect(press_stop_on_first_step)
    record = send(qtbot, window, LONG_PROMPT)

    assert record.outcome.stop_reason == "cancelled"
    assert record.outcome.steps_after_stop <= 1
    assert 0 < record.stats.n_tokens < 48
    assert window.send_button.text() == "Send"
    stored = window.store.messages(record.conversation_id)
    assert stored[-1].role == "assistant" and stored[-1].content == record.text  # the partial reply is kept
    assert "stopped" in window.chat_view.bubbles()[-1].stats_label.text()


def test_switching_lookahead_off_and_changing_w_mid_reply_take_effect_at_the_next_step(qtbot, make_window):
    window = make_window(quick_settings(max_tokens=48, window=4))
    updates: list[StepUpdate] = []

    def change_settings_as_steps_arrive(update) -> None:
        updates.append(update)
        if len(updates) == 1:
            window.panel.lookahead.window_spin.setValue(6)
        elif update.event.window == 6 and window.panel.lookahead.lookahead_check.isChecked():
            window.panel.lookahead.lookahead_check.setChecked(False)

    window.replyStepReceived.connect(change_settings_as_steps_arrive)
    send(qtbot, window, LONG_PROMPT)
    steps = [u for u in updates if u.event.mode != "none"]

    # Every step ran with exactly the setting the worker handed over before it.
    for u in steps:
        if u.requested is None:
            assert u.event.mode == "plain", u
        else:
            assert (u.event.mode, u.event.window) == ("lookahead", u.requested.window), u
    shapes = [(u.event.mode, u.event.window if u.event.mode == "lookahead" else None) for u in steps]
    assert shapes[0] == ("lookahead", 4)
    assert ("lookahead", 6) in shapes
    assert shapes[-1] == ("plain", None)
    # The order of the changes is kept: W4 steps, then W6 steps, then plain steps.
    seen = [s for i, s in enumerate(shapes) if i == 0 or shapes[i - 1] != s]
    assert seen == [("lookahead", 4), ("lookahead", 6), ("plain", None)]
    # A wider window puts more window tokens in each forward pass (batch minus input and draft tokens);
    # plain decoding evaluates one token a step.
    def window_tokens(ev):
        return ev.batch_size - 1 - ev.n_reevaluated - ev.n_drafted

    batches = {s: [window_tokens(u.event) for u, t in zip(steps, shapes, strict=True) if t == s] for s in seen}
    assert min(batches[("lookahead", 6)]) > max(batches[("lookahead", 4)])
    assert min(u.event.batch_size for u, t in zip(steps, shapes, strict=True) if t == ("plain", None)) == 1


def test_chats_survive_a_restart_of_the_window(qtbot, make_window):
    first = make_window(quick_settings(max_tokens=12))
    record = send(qtbot, first, "Hi there!")
    title = first.conversations.titles()
    first.close()

    second = make_window(AppSettings.load())
    assert second.conversations.titles() == title == ["Hi there!"]
    assert second.current_conversation_id() == record.conversation_id
    bubbles = second.chat_view.bubbles()
    assert [(b.role, b.text()) for b in bubbles] == [("user", "Hi there!"), ("assistant", record.text)]
    assert bubbles[1].stats_label.text() == record.stats.summary_line()
    assert second.panel.max_tokens_spin.value() == 12  # settings came back too


def test_a_broken_model_file_shows_the_error_and_leaves_the_app_usable(qtbot, make_window, dialogs, tmp_path):
    window = make_window()
    model_before = window.model
    broken = tmp_path / "x.gguf"
    broken.write_bytes(b"NOPE" + os.urandom(4096))
    window.input.setPlainText("Say hi.")  # typed before the failed load: must not be lost

    with qtbot.waitSignal(window.modelLoadFailed, timeout=30_000):
        window.load_model(str(broken))

    assert len(dialogs.shown) == 1
    kind, title, text = dialogs.shown[0]
    assert kind == "critical" and "not a GGUF file" in text and "x.gguf" in text
    assert window.model == model_before
    assert window.model_label.text().startswith("SmolLM2")
    assert window.input.toPlainText() == "Say hi."
    assert window.send_button.isEnabled()
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        window.send_button.click()
    assert blocker.args[0].text.strip()
    assert window.settings.model_path == ""  # the broken file was not remembered as the model


@pytest.mark.timing
def test_closing_the_window_mid_reply_stops_it_quickly_and_keeps_the_partial_reply(qtbot, make_window):
    window = make_window(quick_settings(max_tokens=48))
    window.input.setPlainText(LONG_PROMPT)
    with qtbot.waitSignal(window.replyStepReceived, timeout=REPLY_TIMEOUT_MS):
        window.send_button.click()

    messages = close_mid_reply(window)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content.strip()
    assert present(ReplyStats.from_stats_json(messages[1].stats_json)).stop_reason == "cancelled"


def test_editing_a_user_message_and_resending_goes_on_from_the_edit_and_keeps_the_old_branch(qtbot, make_window):
    window = make_window(quick_settings(max_tokens=8))
    send(qtbot, window, "What is 2+2?")
    record = send(qtbot, window, "And 3+3?")
    old_branch = window.store.messages(record.conversation_id)
    assert len(old_branch) == 4

    window.chat_view.bubbles()[0].edit_button.click()
    assert window.input.toPlainText() == "What is 2+2?"
    assert window.edit_banner.isVisible()
    record = send(qtbot, window, "What is 5+5?")

    stored = window.store.messages(record.conversation_id)
    assert [(m.role, m.content) for m in stored] == [("user", "What is 5+5?"), ("assistant", record.text)]
    assert not window.edit_banner.isVisible()
    assert [b.role for b in window.chat_view.bubbles()] == ["user", "assistant"]
    assert window.chat_view.bubbles()[0].alternative_text() == "2/2"
    assert window.store.siblings(stored[0].id) == [old_branch[0].id, stored[0].id]
    window.chat_view.bubbles()[0].previous_button.click()
    assert window.store.messages(record.conversation_id) == old_branch  # nothing of it was lost


def test_regenerate_writes_a_new_reply_beside_the_last_one(qtbot, make_window):
    window = make_window(quick_settings(max_tokens=8))
    first = send(qtbot, window, "Tell me a joke.")
    before = window.store.messages(first.conversation_id)
    regenerate = window.chat_view.bubbles()[-1].regenerate_button
    assert regenerate.isVisible()
    requests: list[GenerationRequest] = []
    window.engine.generateRequested.connect(requests.append)
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        regenerate.click()
    second: ReplyRecord = blocker.args[0]
    assert requests[0].drafts_from == (first.text,)  # the replaced reply is offered as drafts
    assert second.stats.n_accepted > first.stats.n_accepted

    stored = window.store.messages(first.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].id == second.message_id
    assert stored[0] == before[0]
    assert stored[1].created > before[1].created  # a new row, not the old reply
    assert window.store.siblings(stored[1].id) == [before[1].id, stored[1].id]  # the old one stays
    assert window.chat_view.bubbles()[-1].alternative_text() == "2/2"
    assert second.text == first.text  # greedy decoding: the same reply again
