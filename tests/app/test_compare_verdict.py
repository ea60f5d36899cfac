"""What a comparison may claim: repeats, their range, the steps' prediction, one set of times, honest progress.

Runs here are scripted (a stand-in engine whose steps take set times and
costs): no model is loaded, and no result depends on the CPU the tests run on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.comparison_jobs import CompareRequest, CompareResult, run_comparison
from app.main_window import MainWindow
from app.widgets.compare_view import CompareView
from engine import LookaheadConfig, Message, StopConfig
from engine.llama.probe import ProbeResult
from engine.speed.comparison import (
    BUSY_NOTE,
    MAX_PAIRS,
    MIN_PAIRS,
    CompareProgress,
    compare_decoders,
    planned_pairs,
    repeats_done,
)
from engine.speed.run_stats import RunStats, median_run, predicted_gain, ran_busy, ratio_range, same_steps, speedup
from tests.helpers.app_fixtures import quick_settings
from tests.helpers.fake_engine import FakeChatSession, Pace, Script, ScriptedEngine, as_engine, fake_chat_session
from tests.helpers.optional import present

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support propagateSizeHints\(\)", r"This plugin does not support raise\(\)"
)

N_TOKENS = 24


PLAIN_PACE = Pace(1, 0.004, 1.0)
# Two tokens a step at 1/0.7 of a plain step's price and time: the steps predict 1.4×, and take it.
SAVING_PACE = Pace(2, 0.004 * 2 / 1.4, 2 / 1.4)
# One token a step, like plain, only on a machine that happened to be quicker: no gain from lookahead.
SAME_STEPS_PACE = Pace(1, 0.003, 1.0)


def _script(lookahead: Pace = SAVING_PACE, drift: tuple[float, ...] = (1.0,), plain: Pace = PLAIN_PACE,
            step_sleep_s: float = 0.0) -> Script:
    """Replies with tokens 0..N_TOKENS-1 at each decoder's ``Pace``; run ``k``'s step times × ``drift[k]`` (cycled:
    the machine's own speed, run by run); ``step_sleep_s``: real time per step, for tests that watch the measurement."""
    return Script(plain=plain, lookahead=lookahead, reply_tokens=N_TOKENS, prefill_s=0.001, drift=drift,
                  step_sleep_s=step_sleep_s, threads=2)


@pytest.fixture
def script() -> Script:
    """How the scripted decoders go, for the engines of ``paced_window`` (``paced`` sets it)."""
    return _script()


@pytest.fixture
def paced(script: Script) -> Callable[..., Script]:
    """Set how the scripted decoders go, for runs started from now on (returns the ``Script``)."""

    def set_pace(lookahead: Pace = SAVING_PACE, drift: tuple[float, ...] = (1.0,), plain: Pace = PLAIN_PACE,
                 step_sleep_s: float = 0.0) -> Script:
        script.plain, script.lookahead, script.drift, script.step_sleep_s = plain, lookahead, drift, step_sleep_s
        return script

    return set_pace


@pytest.fixture
def paced_window(
    make_window: Callable[..., MainWindow], worker_options: dict[str, Any], script: Script,
) -> Callable[[], tuple[MainWindow, ScriptedEngine]]:
    """A window whose engine is a ``ScriptedEngine`` on ``script`` (returned with it)."""
    engines: list[ScriptedEngine] = []

    def make_engine(*args: Any, **kwargs: Any) -> ScriptedEngine:
        engines.append(ScriptedEngine(*args, script=script, **kwargs))
        return engines[-1]

    worker_options.update(engine_factory=make_engine, session_factory=FakeChatSession,
                          check_loadable=lambda *_a, **_k: ProbeResult(probed=False, seconds=0.0),
                          default_model=lambda: Path("/models/paced.gguf"))

    def make() -> tuple[MainWindow, ScriptedEngine]:
        window = make_window(quick_settings(max_tokens=N_TOKENS, auto=False))
        return window, engines[-1]

    return make


def _request(plain_first: bool = True) -> CompareRequest:
    return CompareRequest(request_id=1, messages=(Message("user", "hi"),),
                          lookahead=LookaheadConfig(window=4, ngram=4, guesses=3),
                          stop=StopConfig(max_tokens=N_TOKENS), plain_first=plain_first)


def _compare(
    script: Script, progress: list[CompareProgress] | None = None, stop_at: tuple[int, int] | None = None
) -> tuple[CompareResult, ScriptedEngine]:
    """Run a comparison on a new ``ScriptedEngine``; ``stop_at`` (run, tokens) presses Stop there."""
    engine = ScriptedEngine(script=script)
    cancel = threading.Event()

    def on_progress(p: CompareProgress) -> None:
        if progress is not None:
            progress.append(p)
        if stop_at is not None and (p.run, p.n_tokens) == stop_at and not cancel.is_set():
            cancel.set()
            engine.steps_at_stop = engine.steps_run

    result = run_comparison(fake_chat_session(engine), _request(), cancel, on_progress=on_progress)
    return result, engine


def _shown(qtbot, result: CompareResult) -> CompareView:
    """A compare view that has shown ``result`` (its replay skipped)."""
    view = CompareView()
    qtbot.addWidget(view)
    view.begin(_request(result.plain_first))
    view.on_finished(result)
    view.skip_replay()
    return view


# --- the verdict ---


def test_two_runs_with_the_same_steps_and_different_times_show_no_measurable_difference(qtbot, paced):
    script = paced(lookahead=SAME_STEPS_PACE)  # lookahead's steps ran 25% quicker, one token each, like plain's
    result, _engine = _compare(script)
    verdict = present(result.verdict)

    assert result.speedup == pytest.approx(0.004 / 0.003)  # what the clock said …
    assert verdict.same_steps and not verdict.measurable  # … is not lookahead's doing
    assert verdict.headline == "No measurable difference"
    assert "same steps as plain (1.00 tokens per step)" in verdict.explanation
    view = _shown(qtbot, result)
    text = view.verdict.text()
    assert "No measurable difference" in text and "Speedup" not in text


def test_drafts_that_failed_are_lookaheads_doing_not_the_machines_though_it_took_a_token_a_step(paced):
    # A token a step, as plain, but each step verified a draft of 2 that failed: 3 rows, 10% dearer.
    script = paced(lookahead=Pace(1, 0.0044, 1.1, rows=3), drift=(1.0, 1.01, 0.99, 1.0))
    result, _engine = _compare(script)
    verdict = present(result.verdict)

    assert not verdict.same_steps and verdict.measurable
    assert verdict.measured.value == pytest.approx(1 / 1.1, rel=0.02)
    assert verdict.headline == f"Speedup {verdict.measured.value:.2f}× (lookahead slower)"
    assert "differ only by the machine" not in verdict.explanation


def test_repeats_on_both_sides_of_one_show_no_measurable_difference_and_run_until_the_plan_is_spent(paced):
    # Lookahead saves steps but costs as much per token; the machine's drift makes pairs say 1.18× and 0.91×.
    script = paced(lookahead=Pace(2, 0.008, 2.0), drift=(1.0, 0.85, 1.1, 1.0))
    result, engine = _compare(script)
    verdict = present(result.verdict)

    assert not verdict.same_steps and not verdict.measurable
    assert verdict.measured.low == pytest.approx(1 / 1.1) and verdict.measured.high == pytest.approx(1 / 0.85)
    assert verdict.headline == "No measurable difference"
    assert "on both sides of 1.00×" in verdict.explanation and "the steps predict 1.00×" in verdict.explanation
    # They never agreed: the comparison ran every pair its first run's time planned, in A-B-B-A turns.
    planned = planned_pairs(result.pairs[0].plain.stats.elapsed_s)
    assert len(result.pairs) == planned > MIN_PAIRS
    assert engine.runs[:4] == ["plain", "lookahead", "lookahead", "plain"] and len(engine.runs) == 2 * planned


def test_steps_that_predict_1_4x_with_repeats_that_agree_show_1_4x_with_its_range(qtbot, paced):
    script = paced(drift=(1.0, 1.01, 0.99, 1.0))  # pairs: 1.4 / 1.01 and 1.4 / 0.99, within 3% of each other
    result, engine = _compare(script)
    verdict = present(result.verdict)

    assert len(result.pairs) == MIN_PAIRS and len(engine.runs) == 4  # they agreed: no more repeats
    assert verdict.measurable and not verdict.same_steps
    assert verdict.measured.value == pytest.approx(1.4, rel=0.02)
    assert (verdict.measured.low, verdict.measured.high) == (pytest.approx(1.4 / 1.01), pytest.approx(1.4 / 0.99))
    assert verdict.predicted == pytest.approx(1.4)
    assert verdict.headline == f"Speedup {verdict.measured.value:.2f}×"
    assert verdict.explanation == "1.39–1.41× over 2 pairs of runs; the steps predict 1.40×"
    view = _shown(qtbot, result)
    text = view.verdict.text()
    assert verdict.headline in text and verdict.explanation in text and BUSY_NOTE not in text


def test_a_run_during_which_another_program_held_a_core_says_its_times_may_be_off(qtbot, paced):
    script = paced(lookahead=Pace(2, 0.004 * 2 / 1.4, 2 / 1.4, busy=True))
    result, _engine = _compare(script)
    assert result.busy and present(result.verdict).notice == BUSY_NOTE
    view = _shown(qtbot, result)
    assert BUSY_NOTE in view.verdict.text()


def test_stop_after_the_first_block_keeps_its_pairs_and_runs_no_step_more(paced):
    script = paced(drift=(1.0, 0.85, 1.1, 1.0))  # the pairs disagree, so a third one runs: Stop lands in it
    result, engine = _compare(script, stop_at=(5, 6))
    assert result.complete and len(result.pairs) == 2 and result.verdict is not None
    assert len(engine.runs) == 6 and engine.steps_run == engine.steps_at_stop


def test_a_comparison_stopped_before_its_first_block_is_no_result(paced):
    result, engine = _compare(paced(), stop_at=(2, 4))
    assert result.cancelled and not result.complete and result.verdict is None
    assert len(result.pairs) == 1 and len(engine.runs) == 3 and engine.steps_run == engine.steps_at_stop


# --- the pure parts ---


def test_the_plan_gives_a_quick_prompt_more_pairs_than_a_slow_one_in_whole_blocks():
    assert planned_pairs(0.01) == 6  # a few times the first pair's time
    assert planned_pairs(10.0) == 4  # a 20 s pair: the 90 s cap leaves room for 4
    assert planned_pairs(60.0) == MIN_PAIRS  # the one block a comparison needs, however long
    assert planned_pairs(0.0) % 2 == 0


def test_repeats_end_when_whole_blocks_agree_or_the_plan_is_spent():
    assert not repeats_done([1.4], 6)
    assert repeats_done([1.40, 1.42], 6)
    assert not repeats_done([1.40, 1.42, 1.41], 6)  # half a block: the drift would favour one side
    assert not repeats_done([1.2, 0.9], 6)
    assert repeats_done([1.2, 0.9] * 3, 6)


def test_ratio_range_median_run_and_same_steps_are_defined_on_measured_runs():
    r = ratio_range([1.5, 1.1, 1.3, 1.2])
    assert (r.value, r.low, r.high, r.n) == (1.2, 1.1, 1.5, 4)  # the lower middle value: a measured one
    assert r.includes(1.3) and not r.includes(1.0)
    assert ratio_range([2.0, 2.0]).spread == 0.0

    def run(n_tokens: int, steps: int, seconds: float, cost: float) -> RunStats:
        return RunStats(n_tokens=n_tokens, steps=steps, decode_s=seconds, cost=cost)

    plains = [run(24, 24, s, 24.0) for s in (0.12, 0.10, 0.11)]
    assert median_run(plains) is plains[2]
    assert same_steps(plains[0], run(24, 24, 0.05, 30.0)) and not same_steps(plains[0], run(24, 12, 0.1, 17.0))
    assert same_steps(plains[0], run(20, 20, 0.05, 20.0))  # ended earlier, one token a step all the same
    # A token a step, but two of the passes verified drafts that failed: larger batches, not the same work.
    ones = RunStats(n_tokens=24, steps=24, shapes=[(1, 1)] * 24)
    failed = RunStats(n_tokens=24, steps=24, shapes=[(1, 1)] * 22 + [(3, 3), (4, 4)])
    assert same_steps(ones, RunStats(n_tokens=24, steps=24, shapes=[(1, 1)] * 24))
    assert not same_steps(ones, failed)
    assert predicted_gain(plains[0], run(24, 12, 0.1, 24 / 1.4)) == pytest.approx(1.4)
    assert predicted_gain(plains[0], run(24, 12, 0.1, 0.0)) == 0.0  # steps without a price predict nothing
    # The two median runs' speedup lies within the range of the pairs' speedups.
    las = [run(24, 12, s, 17.0) for s in (0.07, 0.09, 0.06)]
    ratios = [speedup(p, la) for p, la in zip(plains, las, strict=True)]
    assert min(ratios) <= speedup(median_run(plains), median_run(las)) <= max(ratios)


def test_a_run_is_busy_when_its_threads_were_fewer_or_waited_for_a_share_of_its_time():
    engine = ScriptedEngine(script=_script())
    quiet, busy = Pace(1, 0.01, 1.0), Pace(1, 0.01, 1.0, busy=True)
    assert not ran_busy([engine.event(0, "plain", [1], 0.01, quiet)])
    assert ran_busy([engine.event(0, "plain", [1], 0.01, quiet), engine.event(1, "plain", [2], 0.01, busy)])
    assert ran_busy([replace(engine.event(0, "plain", [1], 0.01, quiet), threads=1, kept_threads=1)])
    # A step on trial with fewer threads is not the governor giving one up.
    assert not ran_busy([replace(engine.event(0, "plain", [1], 0.01, quiet), threads=1)])
    # One step that waited among many is a hiccup, not a busy machine; a few percent of the time is.
    waited = replace(engine.event(0, "plain", [1], 0.01, busy), threads=2, kept_threads=2)  # all threads, but late
    assert waited.contended
    one_late = [waited] + [engine.event(i, "plain", [i], 0.01, quiet) for i in range(1, 40)]
    assert not ran_busy(one_late)
    assert ran_busy(one_late[:10])


# --- one set of times, honest progress ---


def test_the_times_in_a_result_agree_with_each_other_in_pane_order(qtbot, paced_window, paced):
    paced(drift=(1.0, 1.01, 0.99, 1.0))
    window, _engine = paced_window()
    view = window.compare_view
    window.show_compare_tab()
    view.input.setPlainText("go")
    with qtbot.waitSignal(view.compareCompleted, timeout=30_000) as blocker:
        view.compare_button.click()
    result: CompareResult = blocker.args[0]
    assert result.plain is not None and result.lookahead is not None
    text = view.verdict.text()

    plain_pane, lookahead_pane = view.plain_pane, view.lookahead_pane
    assert plain_pane.geometry().x() < lookahead_pane.geometry().x()  # plain is the left pane
    # The panes replay the median runs, and their clocks stop at those runs' decoding times …
    assert plain_pane.stats == result.plain.stats and lookahead_pane.stats == result.lookahead.stats
    plain_clock, lookahead_clock = plain_pane.clock.text(), lookahead_pane.clock.text()
    assert plain_clock == f"{result.plain.stats.decode_s:.2f} s" != lookahead_clock
    assert lookahead_clock == f"{result.lookahead.stats.decode_s:.2f} s"
    # … which the verdict line quotes, plain first, with the same rates the panes show.
    assert text.index(f"in {plain_clock}") < text.index(f"in {lookahead_clock}")
    for pane in (plain_pane, lookahead_pane):
        rate = f"{pane.stats.tokens_per_s:.1f} tok/s"
        assert pane.numbers.text().startswith(rate) and rate in text
    assert text.index("plain 24 tokens") < text.index("lookahead 24 tokens")
    # The headline's speedup is those two runs' ratio.
    assert f"Speedup {speedup(plain_pane.stats, lookahead_pane.stats):.2f}×" in text


def test_exact_pairs_run_that_many_whole_blocks_though_the_first_two_agree(paced):
    script = paced(drift=(1.0, 1.01, 0.99, 1.0))  # the first block agrees: the plan would stop there
    engine = ScriptedEngine(script=script)
    wanted = MAX_PAIRS + 2  # more than any plan runs
    result = compare_decoders(as_engine(engine), [1, 2, 3], _request().lookahead, stop=StopConfig(max_tokens=N_TOKENS),
                              exact_pairs=wanted)

    assert len(result.pairs) == wanted and engine.runs[:4] == ["plain", "lookahead", "lookahead", "plain"]
    assert len(engine.runs) == 2 * wanted
    assert present(result.verdict).measured.n == wanted
    for odd in (MIN_PAIRS - 1, MIN_PAIRS + 1):
        with pytest.raises(ValueError, match="whole A-B-B-A blocks"):
            compare_decoders(as_engine(engine), [1, 2, 3], None, exact_pairs=odd)


def test_progress_moves_evenly_over_the_planned_runs_and_never_back():
    progress: list[CompareProgress] = []
    result, engine = _compare(_script(), progress)
    first_run = [p for p in progress if p.run == 0]
    later = [p for p in progress if p.run > 0]

    assert all(p.fraction is None for p in first_run)  # the first run decides the plan
    planned = later[0].planned_runs
    assert planned == 2 * planned_pairs(result.pairs[0].plain.stats.elapsed_s)
    fractions = [present(p.fraction) for p in later]
    assert fractions == sorted(fractions)
    ends = [present(p.fraction) for p in later if p.n_tokens == N_TOKENS and p.phase in ("plain", "lookahead")]
    # Each run ends at its share of the plan, not at a share of max tokens.
    assert {round(f * planned, 6) for f in ends} == {float(k) for k in range(2, len(engine.runs) + 1)}


def test_the_progress_bar_only_moves_forward_while_measuring(qtbot, paced_window, paced):
    paced(drift=(1.0, 0.85, 1.1, 1.0), step_sleep_s=0.002)  # pairs disagree: every planned run happens
    window, engine = paced_window()
    view = window.compare_view
    values: list[int] = []
    view.progress.valueChanged.connect(values.append)
    window.show_compare_tab()
    view.input.setPlainText("go")
    with qtbot.waitSignal(view.compareCompleted, timeout=30_000):
        view.compare_button.click()
    assert len(engine.runs) > 4
    assert len(values) >= 3 and values == sorted(values)
    assert values[-1] == view.progress.maximum()  # the last planned run ended at the end of the bar


# --- the speed report ---


def test_the_speed_report_counts_what_it_lists_and_claims_no_speedup_where_the_steps_were_the_same(
    qtbot, paced_window, paced
):
    paced(lookahead=SAME_STEPS_PACE)
    window, _engine = paced_window()
    dialog = window.open_speed_report()
    qtbot.addWidget(dialog)
    assert dialog.progress.text() == f"0 / {len(dialog.workloads)} prompts"  # before a run: the selection
    dialog.set_selected(["code-prime", "code-reverse"])
    assert dialog.progress.text() == "0 / 2 prompts"
    with qtbot.waitSignal(dialog.reportEnded, timeout=30_000):
        dialog.run_button.click()

    rows = dialog.table_text(dialog.prompt_table)
    assert dialog.progress.text() == f"{len(rows)} / 2 prompts" == "2 / 2 prompts"
    assert [row[5] for row in rows] == ["same steps", "same steps"]
    assert [row[6] for row in rows] == ["1.00×", "1.00×"]  # what the steps predict
    assert dialog.table_text(dialog.category_table)[-1][:4] == ["all", "2", f"{0.004 / 0.003:.2f}×", "1.00×"]
    summary = dialog.summary.text()
    assert "the steps predict 1.00×" in summary and "2 of 2 took the same steps as plain" in summary
