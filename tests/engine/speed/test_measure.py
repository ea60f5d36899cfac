"""Measurement: one run's statistics, one speedup, one roll-up, and everyone who reports them agreeing.

Runs here are recorded (hand-made step events), replayed by a stand-in engine:
no model is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from engine import GenerationControls, LookaheadConfig, Message, SamplingConfig, StepEvent, StopConfig
from engine.costs.curve import DEFAULT_CURVE
from engine.decoding.grammar import Constraint
from engine.speed.rows import ALL, BenchFigures, PromptResult, VerdictFigures, by_category
from engine.speed.run_stats import Divergence, RunStats, first_divergence, geomean, speedup
from engine.speed.workloads import Workload
from engine.tools.bench import BenchReport, run_bench, run_grid
from tests.helpers.fake_engine import ChatEngine, as_engine, fake_chat_session
from tests.helpers.optional import present

LOOKAHEAD = LookaheadConfig(window=4, ngram=4, guesses=3)
EOG = 2


def _step(step: int, mode: str, tokens: list[int], elapsed: float, prefill: float = 0.0, drafted: int = 0,
          accepted: int = 0, reason: str | None = None) -> StepEvent:
    return StepEvent(
        step=step, mode=mode, token_ids=tuple(tokens), text="".join(f"w{t} " for t in tokens if t != EOG),
        n_committed=len(tokens), batch_size=1 if mode == "plain" else 13, n_logits=1, n_drafted=drafted,
        n_accepted=accepted, n_reevaluated=0, window=4, ngram=4, guesses=3, elapsed_s=elapsed, decode_s=elapsed,
        prefill_s=prefill, top2_gaps=tuple(0.25 for _ in tokens) if mode == "plain" else (), stop_reason=reason,
    )


# Plain: 10 tokens, one a step, 10 ms each (100 tokens/s), after 2 ms of prompt evaluation.
PLAIN_RUN = [_step(i, "plain", [10 + i], 0.010, prefill=0.002 if i == 0 else 0.0,
                   reason="max_tokens" if i == 9 else None) for i in range(10)]
# Lookahead: two tokens a step, 15 ms each, and it ends earlier: its 8th token is end-of-text (~133 tokens/s).
LOOKAHEAD_RUN = [_step(i, "lookahead", [10 + 2 * i, 11 + 2 * i] if i < 3 else [16, EOG], 0.015,
                       prefill=0.002 if i == 0 else 0.0, drafted=3, accepted=1, reason="eog" if i == 3 else None)
                 for i in range(4)]
RUN_SPEEDUP = (8 / 0.060) / (10 / 0.100)  # tokens/s ratio; the time ratio would say 0.100 / 0.060


class RecordedEngine(ChatEngine):
    """Replays the recorded runs: ``PLAIN_RUN`` for plain decoding, ``LOOKAHEAD_RUN`` for lookahead.

    Not ``tests.helpers.fake_engine.ScriptedEngine``: these runs are written out step by step (drafts, an
    end-of-text token) for the bench, the grid and the speed report, which use more of the engine (its cost curve,
    threads, documents) than the app's window needs of a fake."""

    def __init__(self) -> None:
        self.summary = SimpleNamespace(path="/models/recorded.gguf")
        self.n_threads = 1
        self.cost_curve = DEFAULT_CURVE
        self.steps_run = 0  # forward passes replayed, over all runs
        self.after_step: Callable[[int], object] = lambda steps_run: None  # a test's hook, e.g. to press Stop
        self.corpus = self.kept = None  # drafts from earlier chats (the bench sets its own)
        self.keep_replies = True

    def reset(self) -> None:
        pass

    def set_documents(self, texts: Sequence[str]) -> None:  # the recorded runs have no attached files
        assert not texts

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return [len(word) for word in text.split()]

    def render_chat(self, messages: Sequence[Message], tools: Sequence[Any] = ()) -> list[int]:
        return [1, 5, 6]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(f"w{t} " for t in tokens if t != EOG)

    def generate(
        self,
        prompt: Sequence[int],
        controls: GenerationControls | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        stop: StopConfig = StopConfig(),
        history: Sequence[int] = (),
        notice: str = "",
        record_gaps: bool = False,
        exact_only: bool = True,
        constraint: Constraint | None = None,
    ) -> Iterator[StepEvent]:
        controls = controls or GenerationControls()
        recorded = PLAIN_RUN if controls.lookahead is None else LOOKAHEAD_RUN
        cancel = controls.cancel

        def events() -> Iterator[StepEvent]:
            for i, ev in enumerate(recorded):
                if cancel.is_set():
                    yield _step(i, "none", [], 0.0, reason="cancelled")
                    return
                self.steps_run += 1
                yield ev
                self.after_step(self.steps_run)

        return events()


# --- one run's statistics ---


def test_run_stats_count_forward_passes_tokens_and_time_of_a_run():
    closing = _step(4, "none", [], 0.0, reason="cancelled")
    stats = RunStats.of([*LOOKAHEAD_RUN[:3], closing])

    assert stats.n_tokens == 6 and stats.token_ids == [10, 11, 12, 13, 14, 15]
    assert stats.steps == 3 and stats.per_step == [2, 2, 2]  # the closing event is not a forward pass
    assert stats.decode_s == pytest.approx(0.045) and stats.prefill_s == pytest.approx(0.002)
    assert stats.elapsed_s == pytest.approx(0.047)
    assert stats.first_token_s == pytest.approx(0.017)  # prompt evaluation and the first step
    assert stats.tokens_per_s == pytest.approx(6 / 0.045) and stats.tokens_per_step == 2.0
    assert stats.acceptance == pytest.approx(3 / 9)
    assert stats.modes == ["lookahead"] and (stats.window, stats.ngram, stats.guesses) == (4, 4, 3)
    assert stats.stop_reason == "cancelled" and stats.text == "w10 w11 w12 w13 w14 w15 "


def test_a_run_that_drafted_nothing_has_no_acceptance_and_an_empty_run_no_speed():
    assert RunStats.of(PLAIN_RUN).acceptance is None
    empty = RunStats()
    assert empty.tokens_per_s == 0.0 and empty.tokens_per_step == 0.0 and empty.first_token_s is None


# --- one speedup ---


def test_speedup_is_the_ratio_of_decoding_speeds_so_a_reply_that_ended_earlier_is_compared_per_token():
    plain, la = RunStats.of(PLAIN_RUN), RunStats.of(LOOKAHEAD_RUN)
    assert speedup(plain, la) == pytest.approx(RUN_SPEEDUP)
    assert speedup(plain, la) != pytest.approx(plain.decode_s / la.decode_s)
    assert speedup(la, plain) == pytest.approx(1 / RUN_SPEEDUP)


def test_speedup_of_replies_with_the_same_tokens_is_the_ratio_of_their_decode_times():
    plain = RunStats.of(PLAIN_RUN)
    faster = RunStats.of([_step(i, "lookahead", [10 + 2 * i, 11 + 2 * i], 0.03, prefill=0.5 if i == 0 else 0.0)
                          for i in range(5)])
    assert faster.token_ids == plain.token_ids
    assert speedup(plain, faster) == pytest.approx(plain.decode_s / faster.decode_s)  # prompt evaluation left out


def test_speedup_is_zero_when_either_run_has_nothing_to_compare():
    plain = RunStats.of(PLAIN_RUN)
    stopped_at_once = RunStats.of([_step(0, "none", [], 0.0, reason="cancelled")])
    assert speedup(plain, stopped_at_once) == 0.0 and speedup(stopped_at_once, plain) == 0.0


def test_the_predicted_speedup_is_tokens_over_the_steps_priced_cost():
    plain = RunStats.of(replace(ev, cost=1.0) for ev in PLAIN_RUN)
    # Four steps of 13 tokens priced at 1.6 each commit 8 tokens: 8 / 6.4 = 1.25 against plain's 1.0.
    la = RunStats.of(replace(ev, cost=1.6 if ev.mode != "none" else 0.0) for ev in LOOKAHEAD_RUN)
    assert plain.predicted_speedup == 1.0
    assert la.predicted_speedup == pytest.approx(8 / 6.4)
    assert RunStats.of(PLAIN_RUN).predicted_speedup == 0.0  # events without a price predict nothing


def test_geomean_averages_ratios_and_ignores_values_that_are_not_ratios():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([4.0, 1.0, 0.0]) == pytest.approx(2.0)
    assert geomean([]) == 0.0


def test_the_first_divergence_names_both_tokens_and_the_plain_runs_top2_gap():
    plain, la = RunStats.of(PLAIN_RUN), RunStats.of(LOOKAHEAD_RUN)
    div = first_divergence(plain, la, RecordedEngine().detokenize)
    assert div == Divergence(index=7, plain_token=17, lookahead_token=EOG, plain_top2_gap=0.25, plain_piece="w17 ",
                             lookahead_piece="")
    assert first_divergence(plain, plain, str) is None
    shorter = RunStats.of(PLAIN_RUN[:4])
    assert present(first_divergence(shorter, plain, RecordedEngine().detokenize)).plain_token == -1  # it had ended


# --- rows and their roll-up ---


def _row(pid: str, cat: str, speedup: float, tps: float, identical: bool,
         oracle_bound: float | None = None) -> PromptResult:
    return PromptResult(id=pid, cat=cat, n_tokens=64, plain_tps=10.0, lookahead_tps=10.0 * speedup, speedup=speedup,
                        tokens_per_step=tps, identical=identical, first_divergence=None,
                        bench=None if oracle_bound is None else BenchFigures(oracle_bound=oracle_bound))


def test_categories_roll_up_in_order_of_first_appearance_then_all():
    rows = by_category([
        _row("a1", "code", 2.0, 2.5, True, oracle_bound=4.0),
        _row("b1", "chat", 1.5, 1.0, False),
        _row("a2", "code", 0.5, 1.5, False, oracle_bound=1.0),
    ])
    assert [(r.cat, r.n, r.identical) for r in rows] == [("code", 2, 1), ("chat", 1, 0), (ALL, 3, 1)]
    assert rows[0].speedup == pytest.approx(1.0) and rows[0].tokens_per_step == pytest.approx(2.0)
    assert rows[0].oracle_bound == pytest.approx(2.0) and rows[1].oracle_bound is None
    assert rows[2].speedup == pytest.approx(1.5 ** (1 / 3)) and rows[2].oracle_bound == pytest.approx(2.0)
    assert by_category([]) == []


def test_the_bench_summary_is_the_same_roll_up():
    rows = [_row("a1", "code", 2.0, 2.5, True, oracle_bound=4.0), _row("b1", "chat", 0.5, 1.5, True)]
    report = BenchReport(results=rows, model="m", lookahead={}, threads=1, max_tokens=8)
    s = report.summary()
    assert s["by_cat"] == {"code": 2.0, "chat": 0.5} and s["geomean"] == 1.0
    assert s["oracle_by_cat"] == {"code": 4.0} and s["oracle_geomean"] == 4.0
    assert (s["identical"], s["n"], s["tokens_per_step"], s["min_speedup"]) == (2, 2, 2.0, 0.5)
    empty = BenchReport(results=[], model="m", lookahead={}, threads=1, max_tokens=8).summary()
    assert (empty["geomean"], empty["n"], empty["by_cat"], empty["oracle_geomean"]) == (0.0, 0, {}, 0.0)


def test_the_bench_counts_the_replies_that_looped_and_gives_the_speedup_over_the_rest():
    rows = [_row("a", "code", 1.2, 2.0, True), _row("b", "chat", 3.0, 5.0, True), _row("c", "chat", 0.9, 1.0, True)]
    rows[1].looped, rows[1].stop_reason = True, "loop"  # stopped by the guard
    rows[2].looped, rows[2].stop_reason = True, "length"  # read as a loop, not stopped
    report = BenchReport(results=rows, model="m", lookahead={}, threads=1, max_tokens=8,
                         sampling=SamplingConfig(repeat_penalty=1.1), loop_guard=True)
    s = report.summary()
    assert (s["looped"], s["stopped_by_guard"], s["geomean_not_looped"], s["min_not_looped"]) == (2, 1, 1.2, 1.2)
    assert s["settings"] == "greedy, repeat penalty 1.1 over the last 64 tokens, loop guard on"
    table = report.table()
    assert "replies that looped: 2 of 3 (1 stopped by the guard); over the 1 that did not: geomean 1.200" in table
    assert "settings: greedy, repeat penalty 1.1 over the last 64 tokens, loop guard on, 8 tokens at most" in table
    assert report.to_json()["sampling"]["repeat_penalty"] == 1.1


def test_the_bench_counts_the_replies_that_follow_their_schema_and_the_share_the_grammar_drafted():
    rows = [_row("a", "extract", 1.2, 2.0, True, oracle_bound=2.0), _row("b", "extract", 1.3, 2.0, True,
                                                                          oracle_bound=2.0)]
    for row, ok in zip(rows, (True, False), strict=True):
        row.bench = BenchFigures(oracle_bound=2.0, follows_schema=ok)
    rows[0].accepted_by_source = {"grammar": 32, "prompt": 10}
    report = BenchReport(results=rows, model="m", lookahead={}, threads=1, max_tokens=8)
    s = report.summary()
    assert (s["under_schema"], s["follow_schema"], s["grammar_share"]) == (2, 1, 0.25)  # 32 of 128 tokens
    assert "replies under a schema: 1 of 2 whole JSON that follows it; 25.0% of all reply tokens" in report.table()
    plain = BenchReport(results=[_row("c", "chat", 1.0, 1.0, True, oracle_bound=1.0)], model="m", lookahead={},
                        threads=1, max_tokens=8)
    assert plain.summary()["under_schema"] == 0 and "under a schema" not in plain.table()


def test_a_row_is_looped_when_the_guard_stopped_plain_or_its_text_reads_as_a_loop():
    work = Workload("p", "chat", "hi")
    looping = RunStats(text="not only " * 12, n_tokens=24, stop_reason="length")
    stopped = RunStats(text="fine", n_tokens=24, stop_reason="loop")
    fine = RunStats(text="A short and ordinary reply.", n_tokens=24, stop_reason="eog")
    assert [PromptResult.from_runs(work, plain, plain, identical=True).looped for plain in (looping, stopped, fine)] \
        == [True, True, False]


FIGURES = VerdictFigures(plain_first=True, speedup_low=1.2, speedup_high=1.4, pairs=4, steps_predict=1.25,
                         same_steps=False, measurable=True, busy=False)


def test_a_prompt_row_is_built_from_two_runs():
    plain, la = RunStats.of(PLAIN_RUN), RunStats.of(LOOKAHEAD_RUN)
    div = first_divergence(plain, la, RecordedEngine().detokenize)
    row = PromptResult.from_runs(Workload("p", "code", "hi"), plain, la, identical=False, divergence=div,
                                 verdict=FIGURES)
    assert (row.id, row.cat, row.n_tokens, row.plain_tps, row.lookahead_tps) == ("p", "code", 8, 100.0, 133.33)
    assert row.speedup == round(RUN_SPEEDUP, 4) and row.tokens_per_step == 2.0
    assert (row.plain_s, row.lookahead_s, row.verdict, row.bench) == (0.1, 0.06, FIGURES, None)
    assert row.first_divergence == {"index": 7, "plain_token": 17, "lookahead_token": EOG, "plain_top2_gap": 0.25,
                                    "plain_piece": "w17 ", "lookahead_piece": ""}


def test_a_rows_json_holds_its_figures_under_extra_as_bench_json_printed_them():
    row = _row("a1", "code", 1.3, 2.0, True)
    assert row.to_json() == {
        "id": "a1", "cat": "code", "n_tokens": 64, "plain_tps": 10.0, "lookahead_tps": 13.0, "speedup": 1.3,
        "tokens_per_step": 2.0, "identical": True, "first_divergence": None, "plain_s": 0.0, "lookahead_s": 0.0,
        "accepted_by_source": {}, "stop_reason": None, "looped": False,
        "extra": {},  # a row without figures (a grid's, one from before repeats)
    }
    row.verdict = FIGURES
    row.bench = BenchFigures(oracle_bound=2.5, runs=8, drafted=30, accepted=12, drafted_steps=10, landed_steps=6,
                             plain_tps_after_first=10.5)
    assert list(row.to_json()["extra"].items()) == [  # the verdict's, then the bench's: what it had, in order
        ("plain_first", True), ("speedup_low", 1.2), ("speedup_high", 1.4), ("pairs", 4), ("steps_predict", 1.25),
        ("same_steps", False), ("measurable", True), ("busy", False), ("oracle_bound", 2.5), ("runs", 8),
        ("drafted", 30), ("accepted", 12), ("drafted_steps", 10), ("landed_steps", 6),
        ("plain_tps_after_first", 10.5),
    ]
    row.bench = replace(row.bench, measured_speedup=1.31, oracle_all_sources=2.9, documents_seen={"a.txt": 0.5})
    extra = row.to_json()["extra"]
    assert list(extra)[8:] == ["measured_speedup", "oracle_bound", "oracle_all_sources", "runs", "drafted",
                               "accepted", "drafted_steps", "landed_steps", "plain_tps_after_first", "documents_seen"]
    assert (extra["measured_speedup"], extra["oracle_all_sources"], extra["documents_seen"]) == (1.31, 2.9,
                                                                                              {"a.txt": 0.5})


# --- everyone who reports a speedup agrees ---


def shown_in_compare_view(qtbot, request, result):
    """A Compare tab that ran ``request`` and got ``result``, its replay skipped to the verdict."""
    from app.widgets.compare_view import CompareView

    view = CompareView()
    qtbot.addWidget(view)
    view.begin(request)
    view.on_finished(result)
    view.skip_replay()
    return view


def test_the_compare_tab_the_speed_report_and_the_bench_give_the_same_speedup_for_the_same_runs(qtbot):
    from app.comparison_jobs import CompareRequest, SpeedReportRequest, run_comparison, run_speed_report
    from engine.speed.comparison import prompt_result

    workload = Workload("recorded", "code", "Count to ten.")
    engine = RecordedEngine()
    session = fake_chat_session(engine)
    expected = round(RUN_SPEEDUP, 4)

    request = CompareRequest(request_id=7, messages=(Message("user", workload.prompt),), lookahead=LOOKAHEAD,
                             stop=StopConfig(max_tokens=10))
    compared = run_comparison(session, request, threading.Event())
    report = run_speed_report(session, SpeedReportRequest(request_id=8, workloads=(workload,), lookahead=LOOKAHEAD,
                                                          max_tokens=10), threading.Event())
    bench = run_bench(as_engine(engine), [workload], LOOKAHEAD, max_tokens=10)

    assert compared.speedup == pytest.approx(RUN_SPEEDUP)
    assert round(compared.speedup, 4) == prompt_result(workload, compared).speedup == expected
    assert [r.speedup for r in report] == [expected]
    assert [r.speedup for r in bench.results] == [expected]
    assert bench.summary()["geomean"] == by_category(report)[-1].speedup == pytest.approx(expected)
    for row in (*report, *bench.results):
        assert (row.plain_tps, row.lookahead_tps, row.n_tokens, row.identical) == (100.0, 133.33, 8, False)
        assert present(row.first_divergence)["index"] == 7

    view = shown_in_compare_view(qtbot, request, compared)
    assert f"Speedup {RUN_SPEEDUP:.2f}×" in view.verdict.text()
    # The panes showed the run's own statistics, not a count of their own.
    assert compared.plain is not None and compared.lookahead is not None
    assert view.plain_pane.stats == compared.plain.stats and view.lookahead_pane.stats == compared.lookahead.stats
    assert "133.3 tok/s · 4 steps · 8 tokens" in view.lookahead_pane.numbers.text()


class ScheduledEngine(RecordedEngine):
    """The recorded runs, the n-th timed run of each mode slowed by the n-th factor of its schedule.

    A timed run is one of ``max_tokens`` 10: the bench's warm-up (16 tokens) and gap run do not count, so the
    bench, the Compare tab and the speed report each meet the same sequence of run times.
    """

    PLAIN = (1.0, 1.12, 0.97, 1.05, 1.3, 0.99, 1.0, 1.08)
    LOOKAHEAD = (1.0, 0.91, 1.18, 1.02, 0.95, 1.25, 1.1, 0.97)

    def __init__(self) -> None:
        super().__init__()
        self.timed = {"plain": 0, "lookahead": 0}

    def generate(
        self,
        prompt: Sequence[int],
        controls: GenerationControls | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        stop: StopConfig = StopConfig(),
        history: Sequence[int] = (),
        notice: str = "",
        record_gaps: bool = False,
        exact_only: bool = True,
        constraint: Constraint | None = None,
    ) -> Iterator[StepEvent]:
        mode = "plain" if controls is None or controls.lookahead is None else "lookahead"
        factor = 1.0
        if stop.max_tokens == 10 and not record_gaps:
            factor = (self.PLAIN if mode == "plain" else self.LOOKAHEAD)[self.timed[mode]]
            self.timed[mode] += 1
        events = super().generate(prompt, controls, sampling, stop, history, notice, record_gaps, exact_only)
        return (replace(ev, elapsed_s=ev.elapsed_s * factor, decode_s=ev.decode_s * factor) for ev in events)


def test_bench_compare_and_the_speed_report_print_the_same_ratio_and_range_for_runs_that_spread(qtbot):
    from app.comparison_jobs import CompareRequest, SpeedReportRequest, run_comparison, run_speed_report
    from engine.speed.comparison import MAX_PAIRS
    from engine.speed.tables import prompt_cells, speedup_cell

    workload = Workload("scheduled", "code", "Count to ten.")
    request = CompareRequest(request_id=1, messages=(Message("user", workload.prompt),), lookahead=LOOKAHEAD,
                             stop=StopConfig(max_tokens=10))
    compared = run_comparison(fake_chat_session(ScheduledEngine()), request, threading.Event())
    (reported,) = run_speed_report(fake_chat_session(ScheduledEngine()), SpeedReportRequest(
        request_id=2, workloads=(workload,), lookahead=LOOKAHEAD, max_tokens=10), threading.Event())
    bench = run_bench(as_engine(ScheduledEngine()), [workload], LOOKAHEAD, max_tokens=10)
    (benched,) = bench.results

    # The pairs spread beyond 5%, so every one planned ran: 6 (six times a 0.1 s pair fits the budget).
    measured = present(compared.verdict).measured
    assert measured.n == len(compared.pairs) == 6 < MAX_PAIRS
    plain_rates = sorted(100 / f for f in ScheduledEngine.PLAIN[:6])  # 10 tokens in 0.1 s, slowed by f
    la_rates = sorted(8 / 0.06 / f for f in ScheduledEngine.LOOKAHEAD[:6])  # 8 tokens in 0.06 s
    assert measured.value == pytest.approx(la_rates[2] / plain_rates[2])  # the lower medians' ratio
    pair_ratios = [(8 / 0.06 / b) / (100 / a)
                   for a, b in zip(ScheduledEngine.PLAIN[:6], ScheduledEngine.LOOKAHEAD[:6], strict=True)]
    assert (measured.low, measured.high) == pytest.approx((min(*pair_ratios, measured.value),
                                                           max(*pair_ratios, measured.value)))
    assert measured.high / measured.low > 1.2  # a real spread, or this test would not tell ranges apart

    for row in (reported, benched):
        figures = row.verdict
        assert figures is not None
        assert (row.speedup, figures.speedup_low, figures.speedup_high, figures.pairs) == (
            round(measured.value, 4), round(measured.low, 4), round(measured.high, 4), 6)
        assert figures.steps_predict == round(present(compared.verdict).predicted, 4)
    cell = speedup_cell(benched)
    assert cell == speedup_cell(reported) == f"{measured.value:.2f}× ({measured.low:.2f}–{measured.high:.2f})"
    assert cell in bench.table() and cell in prompt_cells(reported)

    view = shown_in_compare_view(qtbot, request, compared)
    assert f"Speedup {measured.value:.2f}×" in view.verdict.text()
    assert f"{measured.low:.2f}–{measured.high:.2f}× over 6 pairs of runs" in view.verdict.text()


def test_the_grid_compares_each_shape_with_the_same_speedup():
    engine = RecordedEngine()
    workloads = [Workload("a", "code", "x"), Workload("b", "chat", "y")]
    (row,) = run_grid(as_engine(engine), workloads, [LOOKAHEAD], max_tokens=10)
    assert row.geomean == round(RUN_SPEEDUP, 4) and row.by_cat == {"code": row.geomean, "chat": row.geomean}
    assert (row.identical, row.n, row.tokens_per_step) == (0, 2, 2.0)


# --- the bench stops when asked ---


def test_the_bench_stops_within_one_step_of_cancel_and_leaves_a_part_measured_prompt_out():
    engine = RecordedEngine()
    cancel = threading.Event()
    engine.after_step = lambda n: cancel.set() if n == 13 else None  # 10 steps of warm-up, then 3 of a timed run
    report = run_bench(as_engine(engine), [Workload("a", "code", "x")], LOOKAHEAD, max_tokens=10, cancel=cancel)
    assert report.results == []
    assert engine.steps_run == 13  # not one step more


def test_the_bench_keeps_the_prompts_finished_before_cancel():
    engine = RecordedEngine()
    cancel = threading.Event()
    workloads = [Workload("a", "code", "x"), Workload("b", "code", "y")]
    report = run_bench(as_engine(engine), workloads, LOOKAHEAD, max_tokens=10, cancel=cancel,
                       on_result=lambda r: cancel.set())
    assert [r.id for r in report.results] == ["a"]
    # Two pairs (the recorded runs agree at once), then the untimed run that measures the divergence's gap.
    steps_per_prompt = 2 * len(PLAIN_RUN) + 2 * len(LOOKAHEAD_RUN) + len(PLAIN_RUN)
    assert engine.steps_run == len(PLAIN_RUN) + steps_per_prompt  # warm-up and prompt "a" only
