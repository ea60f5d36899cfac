"""The comparison mode: plain and lookahead side by side, the replay clock, the speed report.

The first half runs without a model (a scripted fake engine behind the real
worker and window); the tests marked ``model`` use the bundled model.
"""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.comparison_jobs import (  # noqa: E402
    FAIRNESS_NOTE,
    CompareRequest,
    CompareResult,
    ReplayTrack,
    run_comparison,
)
from app.main_window import MainWindow  # noqa: E402
from engine import (  # noqa: E402
    LookaheadConfig,
    Message,
    PromptTooLongError,
    StepEvent,
    StopConfig,
)
from engine.decoding.session import FittedPrompt
from engine.llama.probe import ProbeResult  # noqa: E402
from engine.speed import comparison  # noqa: E402
from engine.speed.rows import PromptResult, by_category  # noqa: E402
from engine.speed.tables import report_csv, report_markdown  # noqa: E402
from engine.speed.workloads import load_workloads  # noqa: E402
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, quick_settings
from tests.helpers.fake_engine import FakeChatSession, Pace, Script, ScriptedEngine, fake_chat_session, piece
from tests.helpers.optional import present

# The offscreen platform also cannot raise a window (the speed report dialog asks to be raised when opened).
pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support propagateSizeHints\(\)", r"This plugin does not support raise\(\)"
)

REPORT_TIMEOUT_MS = 180_000


# --- a scripted engine: plain commits 1 token a step, lookahead 2, with fixed step times ---

PLAIN_STEP_S = 0.004
LOOKAHEAD_STEP_S = 0.005
PREFILL_S = 0.002


def _script() -> Script:
    """Replies with tokens 0, 1, 2, …; lookahead can be told to differ at one token (``diverge_at``)."""
    return Script(plain=Pace(1, PLAIN_STEP_S, top2_gap=0.5), lookahead=Pace(2, LOOKAHEAD_STEP_S), prefill_s=PREFILL_S)


def _event(
    step: int, mode: str, tokens: list[int], elapsed: float, reason: str | None = None, prefill: float = 0.0,
) -> StepEvent:
    return StepEvent(
        step=step, mode=mode, token_ids=tuple(tokens), text="".join(piece(t) for t in tokens),
        n_committed=len(tokens), batch_size=1 if mode == "plain" else 13, n_logits=1, n_drafted=0, n_accepted=0,
        n_reevaluated=0, window=4, ngram=4, guesses=3, elapsed_s=elapsed, decode_s=elapsed, prefill_s=prefill,
        top2_gaps=tuple(0.5 for _ in tokens) if mode == "plain" else (), stop_reason=reason,
    )


def no_probe(*_args: object, **_kwargs: object) -> ProbeResult:
    return ProbeResult(probed=False, seconds=0.0)  # a fake engine's file is never loaded by llama.cpp


@pytest.fixture
def script() -> Script:
    """How the engines of ``scripted_engine`` reply: a test may change it before (or while) they run."""
    return _script()


@pytest.fixture
def scripted_engine(worker_options: dict[str, Any], script: Script) -> list[ScriptedEngine]:
    engines: list[ScriptedEngine] = []

    def make(*args: Any, **kwargs: Any) -> ScriptedEngine:
        engines.append(ScriptedEngine(*args, script=script, **kwargs))
        return engines[-1]

    worker_options.update(engine_factory=make, session_factory=FakeChatSession, check_loadable=no_probe,
                          default_model=lambda: Path("/models/scripted.gguf"))
    return engines


ABBA_PLAIN_FIRST = ["plain", "lookahead", "lookahead", "plain"]  # one A-B-B-A block
ABBA_LOOKAHEAD_FIRST = ["lookahead", "plain", "plain", "lookahead"]


def _request(max_tokens: int = 8, plain_first: bool = True) -> CompareRequest:
    return CompareRequest(
        request_id=1, messages=(Message("user", "hi"),), lookahead=LookaheadConfig(window=4, ngram=4, guesses=3),
        stop=StopConfig(max_tokens=max_tokens), plain_first=plain_first,
    )


# --- without a model ---


def test_a_comparison_runs_each_decoder_alone_from_an_empty_cache_in_a_b_b_a_turns_starting_as_asked():
    engine = ScriptedEngine(script=_script())
    session = fake_chat_session(engine)
    first = run_comparison(session, _request(plain_first=True), threading.Event())
    second = run_comparison(session, _request(plain_first=False), threading.Event())

    # Scripted steps take the same time in every run, so one A-B-B-A block agrees with itself: no more repeats.
    assert engine.runs == ABBA_PLAIN_FIRST + ABBA_LOOKAHEAD_FIRST
    assert len(first.pairs) == len(second.pairs) == 2
    assert engine.resets == 10  # before each run, and after each comparison (the chat must not reuse that cache)
    assert first.identical and first.divergence is None
    assert first.plain is not None and first.lookahead is not None and second.lookahead is not None
    assert first.plain.stats.steps == 8 and first.lookahead.stats.steps == 4
    assert first.speedup == pytest.approx((8 * PLAIN_STEP_S) / (4 * LOOKAHEAD_STEP_S))
    assert first.plain.stats.text == second.lookahead.stats.text == "".join(piece(t) for t in range(8))


def test_a_divergent_token_is_located_in_both_texts():
    engine = ScriptedEngine(script=replace(_script(), diverge_at=5))
    result = run_comparison(fake_chat_session(engine), _request(), threading.Event())

    assert not result.identical
    assert result.plain is not None and result.lookahead is not None
    d = present(result.divergence)
    assert (d.index, d.plain_piece, d.lookahead_piece, d.plain_top2_gap) == (5, "w5 ", "w105 ", 0.5)
    assert result.plain.stats.text[d.plain_offset :].startswith("w5 ")
    assert result.lookahead.stats.text[d.lookahead_offset :].startswith("w105 ")


def test_a_cancelled_comparison_says_so_and_skips_the_second_run():
    engine = ScriptedEngine(script=_script())
    cancel = threading.Event()
    cancel.set()
    result = run_comparison(fake_chat_session(engine), _request(), cancel)
    assert result.cancelled and not result.complete
    assert engine.runs == []


def test_the_replay_clock_shows_each_step_once_its_measured_decoding_time_has_passed():
    events = [
        _event(0, "plain", [0], 0.10, prefill=0.05),  # the prompt's evaluation is not on the clock
        _event(1, "plain", [1], 0.10),
        _event(2, "none", [], 0.0, "max_tokens"),
    ]
    track = ReplayTrack(events)
    assert track.duration_s == pytest.approx(0.20)
    assert [track.done_by(t) for t in (0.0, 0.099, 0.101, 0.199, 0.21)] == [0, 0, 1, 1, 3]
    assert track.clock(10.0) == pytest.approx(0.20)
    assert track.clock(-1.0) == 0.0


def _result(pid: str, cat: str, speedup: float, tps: float, identical: bool) -> PromptResult:
    return PromptResult(id=pid, cat=cat, n_tokens=64, plain_tps=10.0, lookahead_tps=10.0 * speedup, speedup=speedup,
                        tokens_per_step=tps, identical=identical, first_divergence=None, plain_s=6.4,
                        lookahead_s=6.4 / speedup)


def test_the_speed_report_tables_group_by_category_and_export_as_csv_and_markdown():
    results = [
        _result("a1", "code", 2.0, 2.5, True),
        _result("a2", "code", 0.5, 1.5, False),
        _result("b1", "chat|x", 1.5, 1.2, True),
    ]
    rows = by_category(results)
    assert [(r.cat, r.n, r.identical) for r in rows] == [("code", 2, 1), ("chat|x", 1, 1), ("all", 3, 2)]
    assert rows[0].speedup == pytest.approx(1.0)  # geometric mean of 2.0 and 0.5
    assert rows[0].tokens_per_step == pytest.approx(2.0)

    parsed = list(csv.reader(io.StringIO(report_csv(results))))
    assert parsed[0][:3] == ["id", "category", "tokens"]
    assert [p[0] for p in parsed[1:4]] == ["a1", "a2", "b1"]
    assert parsed[4][1] == "code" and parsed[-1][1] == "all" and parsed[-1][7] == "2/3"

    md = report_markdown(results)
    assert "| a2 | code | 64 | 10.0 | 5.0 | 0.50× | – | 1.50 | no |" in md  # rows without repeats: one ratio
    assert "chat\\|x" in md  # a pipe in a cell does not break the table
    assert "| all | 3 | 1.14× | – | 1.73 | 2/3 |" in md
    assert "Lookahead 1.14× as fast as plain (geometric mean of 3 prompts)." in md


def _compare(qtbot, window: MainWindow, text: str, timeout: int = 30_000) -> CompareResult:
    view = window.compare_view
    window.show_compare_tab()
    view.input.setPlainText(text)
    with qtbot.waitSignal(view.compareCompleted, timeout=timeout) as blocker:
        view.compare_button.click()
    return blocker.args[0]


def test_the_panes_replay_both_runs_on_their_own_clocks_and_show_the_verdict(qtbot, make_window, scripted_engine):
    window = make_window(quick_settings(max_tokens=40, auto=False))
    view = window.compare_view
    assert view.note.text() == FAIRNESS_NOTE
    ticks: list[tuple[str, str]] = []
    view._replay_timer.timeout.connect(lambda: ticks.append((view.plain_pane.clock.text(),
                                                            view.lookahead_pane.clock.text())))
    result = _compare(qtbot, window, "go")
    assert result.plain is not None and result.lookahead is not None

    assert "plain runs first" in view.note.text()
    assert view.plain_pane.text.toPlainText() == result.plain.stats.text == "".join(piece(t) for t in range(40))
    assert view.lookahead_pane.text.toPlainText() == result.lookahead.stats.text == result.plain.stats.text
    assert view.plain_pane.chart.values() == [1] * 40
    assert view.lookahead_pane.chart.values() == [2] * 20
    assert view.plain_pane.title() == "Plain decoding"
    assert view.lookahead_pane.title() == "Lookahead · W4 N4 G3"
    assert "40 steps" in view.plain_pane.numbers.text() and "20 steps" in view.lookahead_pane.numbers.text()
    # Each pane's clock stops at its own measured decoding time (the prompt's evaluation is quoted apart).
    assert view.plain_pane.clock.text() == f"{40 * PLAIN_STEP_S:.2f} s"
    assert view.lookahead_pane.clock.text() == f"{20 * LOOKAHEAD_STEP_S:.2f} s"
    assert f"prompt {PREFILL_S:.2f} s" in view.plain_pane.numbers.text()
    assert len(ticks) >= 3, "the replay was not animated"
    assert any(plain != la for plain, la in ticks), "the two clocks never differed during the replay"
    speedup = (40 * PLAIN_STEP_S) / (20 * LOOKAHEAD_STEP_S)
    assert result.speedup == pytest.approx(speedup)
    assert f"Speedup {speedup:.2f}×" in view.verdict.text()
    assert f"{speedup:.2f}–{speedup:.2f}× over 2 pairs of runs" in view.verdict.text()
    assert "identical: <b>yes</b>" in view.verdict.text()
    assert view.plain_pane.highlighted_text() == ""

    # The next comparison runs lookahead first, so drift favours neither.
    _compare(qtbot, window, "again")
    assert scripted_engine[-1].runs == ABBA_PLAIN_FIRST + ABBA_LOOKAHEAD_FIRST
    assert "lookahead runs first" in view.note.text()


def test_different_texts_highlight_the_first_divergent_token_in_both_panes(
    qtbot, make_window, scripted_engine, script
):
    script.diverge_at = 3
    window = make_window(quick_settings(max_tokens=8))
    result = _compare(qtbot, window, "go")

    assert not result.identical
    view = window.compare_view
    assert view.plain_pane.highlighted_text() == "w3 "
    assert view.lookahead_pane.highlighted_text() == "w103 "
    verdict = view.verdict.text()
    assert "identical: <b>no</b>" in verdict and "#3" in verdict and "gap 0.500" in verdict


def test_stop_ends_a_comparison_being_measured(qtbot, make_window, scripted_engine, script):
    script.step_sleep_s = 0.01
    window = make_window(quick_settings(max_tokens=2000))
    view = window.compare_view
    window.show_compare_tab()
    view.input.setPlainText("go")
    view.compare_button.click()
    qtbot.waitUntil(lambda: "tokens" in view.status.text(), timeout=10_000)
    assert view.progress.maximum() == 0  # busy: the first run has not yet said how many runs fit
    assert view.compare_button.text() == "Stop" and window.is_busy()
    assert not window.send_button.isEnabled() and not window.menus.open_action.isEnabled()
    with qtbot.waitSignal(view.compareCompleted, timeout=10_000) as blocker:
        window.menus.stop_action.trigger()  # Esc
    result: CompareResult = blocker.args[0]

    assert result.cancelled and result.lookahead is None
    assert scripted_engine[-1].runs == ["plain"]
    assert "Stopped" in view.verdict.text()
    assert view.compare_button.text() == "Compare" and view.compare_button.isEnabled()
    assert window.send_button.isEnabled()


def test_a_comparison_that_cannot_run_says_why_and_leaves_the_tab_usable(
    qtbot, make_window, scripted_engine, dialogs, monkeypatch
):
    def too_long(self: FakeChatSession, messages: Sequence[Message], max_tokens: int) -> FittedPrompt:
        raise PromptTooLongError("the message is 5000 tokens")

    monkeypatch.setattr(FakeChatSession, "fit", too_long)
    window = make_window(quick_settings())
    view = window.compare_view
    window.show_compare_tab()
    view.input.setPlainText("go")
    with qtbot.waitSignal(view.compareFailed, timeout=10_000):
        view.compare_button.click()
    assert dialogs.texts("warning") == ["the message is 5000 tokens"]
    assert "5000 tokens" in view.verdict.text()
    assert view.input.toPlainText() == "go"  # nothing typed is lost
    assert not window.is_busy() and view.compare_button.isEnabled() and window.send_button.isEnabled()


@pytest.mark.timing
def test_a_speed_report_fills_its_tables_and_cancel_stops_it(qtbot, make_window, scripted_engine, script, tmp_path):
    window = make_window(quick_settings())
    dialog = window.open_speed_report()
    qtbot.addWidget(dialog)
    dialog.set_selected(["code-prime", "code-reverse"])
    dialog.max_tokens_spin.setValue(8)
    assert [w.id for w in dialog.selected_workloads()] == ["code-prime", "code-reverse"]
    with qtbot.waitSignal(dialog.reportEnded, timeout=10_000):
        dialog.run_button.click()
    rows = dialog.table_text(dialog.prompt_table)
    assert [row[0] for row in rows] == ["code-prime", "code-reverse"]
    speedup = f"{(8 * PLAIN_STEP_S) / (4 * LOOKAHEAD_STEP_S):.2f}"
    assert [row[5] for row in rows] == [f"{speedup}× ({speedup}–{speedup})"] * 2
    assert dialog.table_text(dialog.category_table)[-1] == ["all", "2", f"{speedup}×", "–", "2.00", "2/2"]
    assert dialog.progress.value() == 2 and dialog.status.text() == "Done: 2 prompt(s)."
    # Each prompt in A-B-B-A turns, the next one starting with the other decoder.
    assert scripted_engine[-1].runs == ABBA_PLAIN_FIRST + ABBA_LOOKAHEAD_FIRST
    dialog.export(tmp_path / "r.md")
    dialog.export(tmp_path / "r.csv")
    assert "| code-prime | code |" in (tmp_path / "r.md").read_text(encoding="utf-8")
    assert (tmp_path / "r.csv").read_text(encoding="utf-8").startswith("id,category,")

    # Slow steps (one prompt would take ~30 s): Cancel must reach the prompt in flight, not wait for it.
    script.step_sleep_s = 0.01
    dialog.max_tokens_spin.setValue(2000)
    dialog.set_all_checked(True)
    dialog.run_button.click()
    assert dialog.cancel_button.isEnabled() and not dialog.run_button.isEnabled() and window.is_busy()
    qtbot.wait(300)
    t0 = time.perf_counter()
    with qtbot.waitSignal(dialog.reportEnded, timeout=10_000) as blocker:
        dialog.cancel_button.click()
    outcome = blocker.args[0]
    assert time.perf_counter() - t0 < 2.0
    assert outcome.cancelled and outcome.results == () and outcome.total == len(dialog.workloads)
    assert dialog.status.text() == f"Cancelled after 0 of {len(dialog.workloads)} prompt(s)."
    assert dialog.progress.text() == f"0 / {len(dialog.workloads)} prompts"
    assert not window.is_busy() and dialog.run_button.isEnabled()


# --- with the bundled model ---

DETERMINISTIC_PROMPT = "List the numbers from 1 to 20, separated by commas."


@pytest.mark.model
def test_a_comparison_with_the_bundled_model_fills_both_panes_identically_and_times_the_speedup(
    qtbot, make_window, monkeypatch
):
    monkeypatch.setattr(comparison, "MAX_PAIRS", comparison.MIN_PAIRS)  # one A-B-B-A block (more: test_compare_verdict)
    window = make_window(quick_settings(max_tokens=40, temperature=0.0, auto=False))
    steps: list = []
    window.engine.worker.compareProgress.connect(steps.append)
    window.compare_view.replay_speed = 4.0  # the race is replayed faster; the timings are the measured ones
    result = _compare(qtbot, window, DETERMINISTIC_PROMPT, timeout=REPLY_TIMEOUT_MS)
    view = window.compare_view

    assert result.complete and result.plain is not None and result.lookahead is not None
    assert result.plain.stats.n_tokens > 10
    assert result.identical, f"greedy lookahead changed the text: {result.divergence}"
    assert view.plain_pane.text.toPlainText() == result.plain.stats.text
    assert view.lookahead_pane.text.toPlainText() == result.lookahead.stats.text == result.plain.stats.text
    assert "identical: <b>yes</b>" in view.verdict.text()
    # The speedup is the ratio of the engine's own step timings.
    plain_s = sum(ev.elapsed_s for ev in result.plain.events)
    lookahead_s = sum(ev.elapsed_s for ev in result.lookahead.events)
    assert plain_s > 0 and lookahead_s > 0
    assert result.speedup == pytest.approx(plain_s / lookahead_s, rel=1e-12)
    # The verdict claims that speedup only where the repeats measured one; it quotes the panes' clocks either way.
    verdict = present(result.verdict)
    assert len(result.pairs) >= 2 and verdict.measured.low <= result.speedup <= verdict.measured.high
    expected = f"Speedup {plain_s / lookahead_s:.2f}×" if verdict.measurable else "No measurable difference"
    assert f"<b>{expected}" in view.verdict.text()
    assert view.plain_pane.clock.text() == f"{plain_s:.2f} s" and view.lookahead_pane.clock.text() == (
        f"{lookahead_s:.2f} s"
    )
    assert f"in {plain_s:.2f} s" in view.verdict.text() and f"in {lookahead_s:.2f} s" in view.verdict.text()
    assert all(ev.mode in ("plain", "none") for ev in result.plain.events)
    assert any(ev.mode == "lookahead" and ev.batch_size > 1 for ev in result.lookahead.events)
    assert view.plain_pane.chart.values() == [ev.n_committed for ev in result.plain.events if ev.mode != "none"]
    assert view.lookahead_pane.chart.values() == [
        ev.n_committed for ev in result.lookahead.events if ev.mode != "none"
    ]
    assert {p.phase for p in steps} == {"plain", "lookahead"}


@pytest.mark.model
def test_cancel_stops_a_speed_report_with_the_bundled_model(qtbot, make_window):
    window = make_window(quick_settings())
    dialog = window.open_speed_report()
    qtbot.addWidget(dialog)
    ids = [w.id for w in load_workloads()[:2]]
    dialog.set_selected(ids)
    dialog.max_tokens_spin.setValue(24)
    with qtbot.waitSignal(dialog.rowAdded, timeout=REPORT_TIMEOUT_MS):
        dialog.run_button.click()
    with qtbot.waitSignal(dialog.reportEnded, timeout=30_000) as blocker:
        dialog.cancel_button.click()
    outcome = blocker.args[0]
    assert outcome.cancelled
    assert [r.id for r in outcome.results] == ids[:1]
    assert dialog.table_text(dialog.prompt_table)[0][0] == ids[0]
    assert not window.is_busy()


@pytest.mark.model
def test_the_panes_keep_working_after_a_model_switch(qtbot, make_window, model_path, monkeypatch):
    monkeypatch.setattr(comparison, "MAX_PAIRS", comparison.MIN_PAIRS)  # the panes are under test here, not the repeats
    window = make_window(quick_settings(max_tokens=16))
    window.compare_view.replay_speed = 8.0
    before = _compare(qtbot, window, "Say hello.", timeout=REPLY_TIMEOUT_MS)
    assert before.complete and before.plain is not None

    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(str(model_path))
    assert window.model.path == str(model_path)

    after = _compare(qtbot, window, "Say hello.", timeout=REPLY_TIMEOUT_MS)
    assert after.complete and after.plain is not None and after.lookahead is not None
    assert after.plain.stats.text.strip()
    assert window.compare_view.plain_pane.text.toPlainText() == after.plain.stats.text
    assert window.compare_view.lookahead_pane.text.toPlainText() == after.lookahead.stats.text
    assert after.plain.stats.text == before.plain.stats.text  # greedy: the same model gives the same reply
