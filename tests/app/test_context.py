"""The context meter, the line where a chat's memory starts, and the prompt's processing numbers (bundled model)."""

from __future__ import annotations

import pytest

from app.settings import AppSettings
from app.stats import ReplyStats
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, REPLY_TIMEOUT_MS, quick_settings, send

pytestmark = [pytest.mark.model, OFFSCREEN_NOISE]

# About 170 tokens: four of them with their replies outgrow a 512-token context.
FILLER = " ".join(f"Item {k} is a small round stone of a grey colour." for k in range(14))


def test_prompt_numbers_count_what_the_cache_kept_between_turns(qtbot, make_window):
    window = make_window(quick_settings(max_tokens=8, lookahead_on=False))
    first = send(qtbot, window, "Name a colour.")
    second = send(qtbot, window, "Name another one.")
    for record in (first, second):
        s = record.stats
        assert s.prompt_tokens > 0
        # cached + evaluated before the first step + the last prompt token (evaluated by that step)
        assert s.prompt_cached_tokens + s.prefill_tokens + 1 == s.prompt_tokens
        assert s.prompt_tokens_per_s > 0
        assert f"prompt {s.prompt_tokens} tokens ({s.prompt_cached_tokens} cached" in s.summary_line()
    assert first.stats.prompt_cached_tokens == 0
    assert second.stats.prompt_cached_tokens > first.stats.prompt_tokens // 2  # the first turn was reused
    assert "cached" in window.panel.live.prompt.text()
    stored = ReplyStats.from_stats_json(window.store.messages(second.conversation_id)[-1].stats_json)
    assert stored is not None and stored.prompt_cached_tokens == second.stats.prompt_cached_tokens
    meter = window.chat_pane.context_meter
    assert meter.used == second.stats.prompt_tokens + second.stats.n_tokens
    assert meter.system == second.stats.system_tokens > 0  # the default system prompt
    assert f"/ {window.model.n_ctx:,} tokens" in meter.label.text() and not meter.warning


def test_a_chat_past_its_context_shows_where_the_models_memory_starts(qtbot, make_window):
    window = make_window(quick_settings(n_ctx=512, max_tokens=8, lookahead_on=False))
    records = [send(qtbot, window, f"Turn {k}. {FILLER} Say OK.") for k in range(4)]
    last = records[-1].stats
    assert last.dropped_messages >= 2, [r.stats.dropped_messages for r in records]
    view = window.chat_view
    bubbles = view.bubbles()
    assert [b.is_left_out for b in bubbles] == [k < last.dropped_messages for k in range(len(bubbles))]
    assert view.left_out_line is not None and "no longer sees" in view.left_out_line.text()
    meter = window.chat_pane.context_meter
    assert meter.used is not None and 512 // 2 < meter.used <= 512  # what is left still fills much of it
    # Still saved (and exported) in full.
    assert len(window.store.messages(records[-1].conversation_id)) == 8
    _name, markdown = window.chat.markdown_export()
    assert "Turn 0." in markdown
    window.close()

    again = make_window(AppSettings.load())
    bubbles = again.chat_view.bubbles()
    assert sum(b.is_left_out for b in bubbles) == last.dropped_messages
    assert again.chat_view.left_out_line is not None


def test_a_message_too_long_for_the_context_is_refused_with_a_reason_and_given_back(qtbot, make_window, dialogs):
    window = make_window(quick_settings(n_ctx=256, max_tokens=8))
    text = "Summarise: " + FILLER * 2
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.replyRejected, timeout=REPLY_TIMEOUT_MS):
        window.send_button.click()
    assert any("shorten it or raise the context size" in t for t in dialogs.texts("warning")), dialogs.shown
    assert window.input.toPlainText() == text
    assert window.chat_view.bubbles() == []
