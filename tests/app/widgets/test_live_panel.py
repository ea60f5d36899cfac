"""The live statistics panel: the estimate against plain, what each number means, round chart ticks, whose
reply the numbers are when the chat in view changes, and what W, N, G show under Auto.

Windows run on a fake engine whose steps carry a price on the cost curve, so no model is loaded.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import partial

import pytest
from PySide6.QtCharts import QValueAxis
from PySide6.QtWidgets import QLabel

from app.settings import AppSettings
from app.stats import ReplyStats
from app.store import ChatStore
from app.widgets.decoding_panel import DecodingPanel
from app.widgets.stats_view import LiveStatsView, StepChart, nice_interval
from engine import GenerationControls, StepEvent
from tests.helpers import app_fixtures
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine

pytestmark = OFFSCREEN_NOISE

TIMEOUT_MS = 10_000
send = partial(app_fixtures.send, timeout_ms=TIMEOUT_MS)
STEP_COST = 1.25  # what the fake prices a drafting step at, in plain one-token steps


def step_event(step: int, mode: str = "lookahead", drafted: bool = True, reason: str | None = None,
               cost: float = STEP_COST) -> StepEvent:
    """A forward pass: a drafting one commits 2 tokens (1 of 3 draft tokens accepted), a plain one 1, at 1.0."""
    n = 2 if drafted else 1
    auto = mode == "auto"
    return StepEvent(
        step=step, mode=mode, token_ids=(7,) * n, text=" w" * n, n_committed=n, batch_size=13 if drafted else 1,
        n_logits=13 if drafted else 1, n_drafted=3 if drafted else 0, n_accepted=1 if drafted else 0,
        n_reevaluated=0, window=0 if auto else 4, ngram=(4 if drafted else 0) if auto else 4,
        guesses=(1 if drafted else 0) if auto else 3, elapsed_s=0.002, decode_s=0.002, stop_reason=reason,
        token_texts=(" w",) * n, token_sources=("prompt", "own")[-n:], threads=1, max_threads=1,
        choice="history match 9, L=3, expect 2.60 tokens" if drafted else "plain: no draft worth its cost",
        cost=cost if drafted else 1.0,
    )


class PricedSession:
    """Replies in ``steps`` steps, every third one plain; holds after ``hold_after`` steps until ``release`` is set.

    Reply k has k + ``steps`` - 1 steps, so a chat's alternatives differ in their counts.
    """

    steps = 6
    hold_after: int | None = None
    release = threading.Event()
    priced = True
    replies = 0

    def __init__(self, engine) -> None:
        self.engine = engine

    def reply(self, messages, controls: GenerationControls, sampling=None, stop=None, drafts_from=()):
        PricedSession.replies += 1
        total = PricedSession.steps + PricedSession.replies - 1
        mode = "auto" if controls.lookahead is not None and controls.lookahead.auto else "lookahead"

        def events():
            for step in range(total):
                if step == PricedSession.hold_after:
                    while not PricedSession.release.wait(0.01):
                        if controls.cancel.is_set():
                            break
                if controls.cancel.is_set():
                    yield StepEvent(step=step, mode="none", token_ids=(), text="", n_committed=0, batch_size=0,
                                    n_logits=0, n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0,
                                    guesses=0, elapsed_s=0.0, decode_s=0.0, stop_reason="cancelled")
                    return
                ev = step_event(step, mode, drafted=step % 3 != 2, reason="eog" if step == total - 1 else None,
                                cost=STEP_COST if PricedSession.priced else 0.0)
                yield ev if PricedSession.priced else _unpriced(ev)

        return events()


def _unpriced(ev: StepEvent) -> StepEvent:
    return replace(ev, cost=0.0)


@pytest.fixture
def priced_engine(worker_options):
    PricedSession.steps = 6
    PricedSession.hold_after = None
    PricedSession.release = threading.Event()
    PricedSession.priced = True
    PricedSession.replies = 0
    use_fake_engine(worker_options, PricedSession)
    yield
    PricedSession.release.set()  # a test that failed while holding a reply must not leave it waiting


def expected_speedup(steps: int) -> float:
    """Tokens over summed cost for PricedSession's reply of ``steps`` steps."""
    drafting = [i % 3 != 2 for i in range(steps)]
    return sum(2 if d else 1 for d in drafting) / sum(STEP_COST if d else 1.0 for d in drafting)


# --- the estimate against plain ---


def test_the_panel_shows_the_predicted_speedup_while_a_reply_is_written(qtbot, make_window, priced_engine):
    PricedSession.hold_after = 3
    window = make_window(quick_settings())
    live = window.panel.live
    window.input.setPlainText("go")
    window.send_button.click()
    qtbot.waitUntil(lambda: live.tokens.text() == "5 / 3", timeout=TIMEOUT_MS)

    assert live.speedup.text().startswith(f"≈ {expected_speedup(3):.1f}× vs plain")  # 5 tokens for 3.5 steps
    assert "prediction, not a timed race" in live.speedup.toolTip()
    assert live.speedup_note.isVisibleTo(window.panel) and "measured costs" in live.speedup_note.text()
    assert live.caption.text() == "Writing a reply in this chat"
    with qtbot.waitSignal(window.replyCompleted, timeout=TIMEOUT_MS) as blocker:
        PricedSession.release.set()
    record = blocker.args[0]
    assert record.stats.predicted_speedup == pytest.approx(expected_speedup(6))
    assert f"≈{expected_speedup(6):.1f}× vs plain" in window.chat_view.bubbles()[-1].stats_label.text()


def test_the_estimate_is_stored_with_the_reply_and_shown_again_from_the_store(qtbot, make_window, priced_engine):
    window = make_window(quick_settings())
    record = send(qtbot, window, "go")
    store = ChatStore()
    try:
        (saved,) = [m for m in store.messages(record.conversation_id) if m.role == "assistant"]
    finally:
        store.close()
    loaded = ReplyStats.from_stats_json(saved.stats_json)
    assert loaded is not None and loaded.cost == pytest.approx(record.stats.cost)
    window.close()

    again = make_window(AppSettings.load())
    assert again.panel.live.speedup.text().startswith(f"≈ {expected_speedup(6):.1f}× vs plain")
    assert f"≈{expected_speedup(6):.1f}× vs plain" in again.chat_view.bubbles()[-1].stats_label.text()


def test_unpriced_steps_show_no_estimate_anywhere(qtbot, make_window, priced_engine):
    PricedSession.priced = False
    window = make_window(quick_settings())
    record = send(qtbot, window, "go")
    assert window.panel.live.speedup.text() == "vs plain: –"
    assert not window.panel.live.speedup_note.isVisibleTo(window.panel)
    assert "vs plain" not in record.stats.summary_line()
    assert '"cost"' not in record.stats.to_stats_json()  # rows stay as they were written before steps had a cost


# --- what the numbers mean ---


def test_every_statistic_and_control_says_what_it_means_on_hover(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    live = panel.live
    values = [live.tokens_per_s, live.tokens_per_step, live.acceptance, live.first_token,
              live.prompt, live.tokens, live.shape, live.threads]
    assert len(live.row_names) == len(values)
    for name in live.row_names.values():
        assert len(name.toolTip()) > 30, name.text()
    for value in values:
        assert len(value.toolTip()) > 30, value
    for widget in (live.speedup, live.speedup_note, live.chart, panel.lookahead.auto_check, panel.lookahead.auto_choice,
                   panel.lookahead.window_spin, panel.lookahead.ngram_spin, panel.lookahead.guesses_spin):
        assert len(widget.toolTip()) > 30, widget
    assert "steps that drafted nothing" in live.row_names["tokens_per_step"].toolTip()
    assert "not a timed race" in live.speedup.toolTip()


def test_accepted_drafts_read_as_a_count_of_tokens_offered_beside_how_many_steps_drafted(qtbot):
    view = LiveStatsView()
    qtbot.addWidget(view)
    stats = ReplyStats()
    events = [step_event(i, drafted=i < 2) for i in range(10)]  # 2 drafting steps, then 8 plain ones
    for ev in events:
        stats.observe(ev)
    view.show_progress(stats, [ev.n_committed for ev in events], events[-1])
    assert view.acceptance.text() == "2 of 6 tokens offered (33%)"
    assert view.tokens_per_step.text() == "1.20  (2 of 10 steps drafted)"
    assert view.row_names["acceptance"].text() == "Drafts accepted"


# --- the chart ---


@pytest.mark.parametrize(("span", "interval"), [(4, 1), (20, 5), (164, 50), (1000, 200), (1500, 500), (7, 2)])
def test_tick_intervals_are_round_numbers(span, interval):
    assert nice_interval(span) == interval


def test_the_chart_ticks_steps_at_round_numbers_and_tokens_at_whole_ones(qtbot):
    chart = StepChart()
    qtbot.addWidget(chart)
    chart.append([1, 3, 2, 1] * 41)  # 164 steps
    x, y = chart.axis_x, chart.axis_y
    assert x.tickType() == QValueAxis.TickType.TicksDynamic and x.tickAnchor() == 0
    assert (x.max(), x.tickInterval()) == (164, 50)  # 0, 50, 100, 150
    assert y.tickType() == QValueAxis.TickType.TicksDynamic and (y.max(), y.tickInterval()) == (4, 1)
    chart.append([12])
    assert (y.max(), y.tickInterval()) == (13, 5)
    x.setRange(0, 1000)  # as the Compare tab does to line two charts up
    assert x.tickInterval() == 200


def test_the_tokens_axis_labels_every_whole_token_only_where_the_plot_is_tall_enough_for_them(qtbot):
    """At the chart's least height nine labels (0 to 8 tokens) do not fit, and QtCharts shows them as "…"."""
    chart = StepChart()
    qtbot.addWidget(chart)
    chart.resize(280, chart.minimumHeight())
    chart.show()
    qtbot.waitExposed(chart)
    chart.append([1, 1, 3, 7, 1])
    line = chart.fontMetrics().height()

    def labels_fit() -> bool:
        y = chart.axis_y
        return chart.chart().plotArea().height() * y.tickInterval() / (y.max() - y.min()) >= 2 * line

    qtbot.waitUntil(lambda: chart.chart().plotArea().height() > 0)
    assert chart.axis_y.max() == 8 and chart.axis_y.tickInterval() == 2 and labels_fit()
    chart.resize(280, 700)
    qtbot.waitUntil(lambda: chart.axis_y.tickInterval() == 1)
    assert labels_fit()


def test_the_chart_takes_each_repaints_steps_in_one_update_of_each_series_however_long_the_reply(qtbot):
    """A series redrawn once per point costs more with every step: a long fast reply froze the window."""
    chart = StepChart()
    qtbot.addWidget(chart)
    chart.append([1] * 1000)
    series = (chart.bars.upperSeries(), chart.mean)
    added, replaced = [0, 0], [0, 0]
    for k, s in enumerate(series):
        s.pointAdded.connect(lambda _i, k=k: added.__setitem__(k, added[k] + 1))
        s.pointsReplaced.connect(lambda k=k: replaced.__setitem__(k, replaced[k] + 1))
    chart.append([2, 3, 1, 4])
    assert added == [0, 0] and replaced == [1, 1]
    assert chart.values() == [1] * 1000 + [2, 3, 1, 4]
    upper = chart.bars.upperSeries().points()
    assert len(upper) == 1 + 2 * 1004 and (upper[-2].x(), upper[-2].y(), upper[-1].x()) == (1003, 4, 1004)
    assert chart.mean.points()[-1].y() == pytest.approx((1000 + 10) / 1004)
    chart.clear()
    assert chart.values() == [] and len(chart.bars.upperSeries().points()) == 1 and chart.mean.count() == 0

# --- whose reply the numbers are ---


def test_switching_chats_shows_the_last_reply_of_the_chat_in_view(qtbot, make_window, priced_engine):
    window = make_window(quick_settings())
    live = window.panel.live
    first = send(qtbot, window, "chat A")
    assert live.tokens.text() == "10 / 6" and live.caption.text() == "Last reply of this chat"

    window.new_chat()
    assert live.tokens.text() == "–" and live.chart.values() == []
    assert live.caption.text() == "No reply in this chat yet"
    send(qtbot, window, "chat B")
    assert live.tokens.text() == "12 / 7"  # the second reply has a step more

    window.conversations.list.setCurrentRow(window.conversations.titles().index("chat A"))
    assert window.current_conversation_id() == first.conversation_id
    assert live.tokens.text() == "10 / 6" and live.chart.values() == first.stats.per_step
    assert live.speedup.text().startswith(f"≈ {expected_speedup(6):.1f}×")
    assert live.caption.text() == "Last reply of this chat"


def test_flipping_to_another_alternative_shows_that_replys_numbers(qtbot, make_window, priced_engine):
    window = make_window(quick_settings())
    live = window.panel.live
    send(qtbot, window, "go")
    with qtbot.waitSignal(window.replyCompleted, timeout=TIMEOUT_MS):
        window.chat_view.bubbles()[-1].regenerate_button.click()
    assert live.tokens.text() == "12 / 7"
    window.chat_view.bubbles()[-1].previous_button.click()
    assert live.tokens.text() == "10 / 6"
    window.chat_view.bubbles()[-1].next_button.click()
    assert live.tokens.text() == "12 / 7"


def test_a_reply_running_in_another_chat_is_named_above_its_numbers(qtbot, make_window, priced_engine):
    window = make_window(quick_settings())
    live = window.panel.live
    send(qtbot, window, "chat A")
    PricedSession.hold_after = 2
    window.new_chat()
    window.input.setPlainText("chat B")
    window.send_button.click()
    qtbot.waitUntil(lambda: live.tokens.text() == "4 / 2", timeout=TIMEOUT_MS)

    window.conversations.list.setCurrentRow(window.conversations.titles().index("chat A"))
    assert live.caption.text() == "Writing a reply in “chat B”, not the chat shown"
    assert live.tokens.text() == "4 / 2"  # still the running reply's, as it goes on
    with qtbot.waitSignal(window.replyCompleted, timeout=TIMEOUT_MS):
        PricedSession.release.set()
    assert live.tokens.text() == "12 / 7"
    assert live.caption.text() == "Last reply, in “chat B”: not the chat shown"
    window.conversations.list.setCurrentRow(window.conversations.titles().index("chat B"))
    assert live.caption.text() == "Last reply of this chat" and live.tokens.text() == "12 / 7"


# --- W, N, G under Auto ---


def _shape_label_shown(panel: DecodingPanel) -> QLabel | None:
    page = panel.lookahead.shape_stack.currentWidget()
    return page if isinstance(page, QLabel) else None


def test_under_auto_w_n_g_give_way_to_what_auto_chose_and_come_back_unchanged(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    panel.load_settings(quick_settings(auto=False, window=7, ngram=5, guesses=2))
    assert _shape_label_shown(panel) is None and panel.lookahead.window_spin.isEnabled()

    panel.lookahead.auto_check.setChecked(True)
    label = _shape_label_shown(panel)
    assert label is panel.lookahead.auto_choice and "set by Auto" in label.text() and "no step yet" in label.text()
    panel.show_step(step_event(0, "auto"))
    assert label.text().endswith("Last step: W0 N4 G1, 3-token draft")
    assert "history match 9" in label.toolTip()
    panel.show_step(step_event(1, "auto", drafted=False))
    assert label.text().endswith("Last step: plain step")
    panel.show_step(step_event(2, "lookahead"))  # a fixed shape is not Auto's choice
    assert label.text().endswith("Last step: plain step")

    saved = AppSettings()
    panel.store_settings(saved)
    assert (saved.auto, saved.window, saved.ngram, saved.guesses) == (True, 7, 5, 2)
    panel.lookahead.auto_check.setChecked(False)
    assert _shape_label_shown(panel) is None
    controls = panel.lookahead
    assert (controls.window_spin.value(), controls.ngram_spin.value(), controls.guesses_spin.value()) == (7, 5, 2)
    assert panel.lookahead.window_spin.isEnabled()


def test_a_reply_under_auto_shows_auto_s_last_choice_in_the_panel(qtbot, make_window, priced_engine):
    window = make_window(quick_settings(auto=True))
    send(qtbot, window, "go")  # its last step is plain: Auto found no draft worth its cost
    assert window.panel.lookahead.auto_choice.text().endswith("Last step: plain step")
    assert "no draft worth its cost" in window.panel.lookahead.auto_choice.toolTip()
    assert window.panel.live.shape.text() == "auto  plain step  (batch 1)"
    window.panel.lookahead.auto_check.setChecked(False)
    assert (window.settings.window, window.settings.ngram, window.settings.guesses) == (4, 4, 3)
