"""Plain against lookahead on the same prompt: the measurement, its verdict, the replay clock, the speed report.

No Qt here. ``run_comparison`` and ``run_speed_report`` run on the worker
thread (it owns the engine); everything else is pure and tested without a model.

Fair timing: on a CPU two decoders running at once would compete for the same
cores, and the race would measure contention. So the two run one after the
other, each from an empty cache, in A-B-B-A turns as ``engine bench`` runs
them (drift in the machine's speed hits both alike), repeated until the pairs'
speedups agree or the time planned for them is spent. The verdict claims a
speedup only where the repeats measured one (``Verdict``); the window replays
each decoder's median run at the pace its steps were measured at, and every
number it quotes comes from those two runs.
"""

from __future__ import annotations

import bisect
import csv
import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine import (
    ChatSession,
    GenerationControls,
    LookaheadConfig,
    Message,
    RunStats,
    SamplingConfig,
    StepEvent,
    StopConfig,
)
from engine.documents import read_document, with_documents
from engine.measure import (
    ALL,
    CategoryRow,
    Divergence,
    PromptResult,
    RatioRange,
    Workload,
    by_category,
    first_divergence,
    geomean,
    median_run,
    predicted_gain,
    ran_busy,
    ratio_range,
    same_steps,
    speedup,
)

FAIRNESS_NOTE = (
    "Runs one after the other in A-B-B-A turns, repeated until their ratio settles, so the two never compete "
    "for the CPU; each pane replays its decoder's median run at measured speed."
)
BUSY_NOTE = "Another program was using the CPU during this run: times may be off."

PLAIN = "plain"
LOOKAHEAD = "lookahead"

# How many times the two decoders run. One A-B-B-A block (two pairs) is the least that says how far the
# pairs' ratios spread; more blocks run while they disagree, until the time planned for them is spent.
MIN_PAIRS = 2
MAX_PAIRS = 8
AGREE = 0.05  # the pairs' speedups agree when they lie within 5% of their median
BUDGET_FACTOR = 6  # repeats may take this many times the first pair's time …
MAX_BUDGET_S = 90.0  # … but no more than this (a long reply still gets its one block)


def planned_pairs(first_run_s: float) -> int:
    """How many pairs a comparison runs at most, from its first run's time (whole A-B-B-A blocks)."""
    pair_s = 2 * first_run_s
    n = BUDGET_FACTOR if BUDGET_FACTOR * pair_s <= MAX_BUDGET_S else int(MAX_BUDGET_S // pair_s)
    n = max(MIN_PAIRS, min(MAX_PAIRS, n))
    return n - n % 2


def repeats_done(ratios: Sequence[float], planned: int) -> bool:
    """True once the pairs run are enough: the plan is spent, or whole blocks agree within ``AGREE``."""
    n = len(ratios)
    if n >= planned:
        return True
    return n >= MIN_PAIRS and n % 2 == 0 and ratio_range(ratios).spread <= AGREE


@dataclass(frozen=True)
class CompareRequest:
    """One prompt to run through both decoders, with the chat's context and sampling."""

    request_id: int
    messages: tuple[Message, ...]  # system prompt (if any) + the user's message
    lookahead: LookaheadConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    plain_first: bool = True


@dataclass(frozen=True)
class CompareProgress:
    """Sent at every step while measuring (the window shows it; the replay comes after).

    The plan is known once the first run has ended (its time sets how many
    runs fit, its length how far along a later run is): until then
    ``fraction`` is None.
    """

    request_id: int
    phase: str  # PLAIN or LOOKAHEAD
    n_tokens: int  # of the run in flight
    max_tokens: int
    run: int = 0  # the run in flight, from 0
    planned_runs: int = 0  # at most; 0 while the first run decides it
    expected_tokens: int = 0  # the first run's length

    @property
    def fraction(self) -> float | None:
        """How much of the planned runs is done, 0..1 (None while the plan is not known)."""
        if self.planned_runs <= 0:
            return None
        within = min(self.n_tokens / self.expected_tokens, 1.0) if self.expected_tokens > 0 else 0.0
        return min((self.run + within) / self.planned_runs, 1.0)


@dataclass(frozen=True)
class RunRecord:
    """One decoder's measured run: every step event, in order (for the replay), and their statistics."""

    events: tuple[StepEvent, ...]
    stats: RunStats

    @classmethod
    def from_events(cls, events: Sequence[StepEvent]) -> RunRecord:
        return cls(tuple(events), RunStats.of(events))


@dataclass(frozen=True)
class Pair:
    """One plain run and one lookahead run, run back to back."""

    plain: RunRecord
    lookahead: RunRecord

    @property
    def speedup(self) -> float:
        return speedup(self.plain.stats, self.lookahead.stats)


@dataclass(frozen=True)
class DivergenceMark(Divergence):
    """Where the two replies first differ, also located in each reply's text for highlighting."""

    plain_offset: int  # character offset of the divergent token in the plain text
    lookahead_offset: int


@dataclass(frozen=True)
class Verdict:
    """What a comparison may claim, worded for the user: a speedup only where the repeats measured one.

    ``plain`` and ``lookahead`` are the runs the panes replay; every time and
    rate quoted is theirs. ``measured`` is their speedup with the lowest and
    highest of the pairs' speedups around it; ``predicted`` what the steps
    alone predict (0.0: the steps carry no cost).
    """

    plain: RunStats
    lookahead: RunStats
    measured: RatioRange
    predicted: float
    same_steps: bool
    busy: bool

    @property
    def measurable(self) -> bool:
        """True when lookahead saved steps and every repeat says the same side of 1.0."""
        m = self.measured
        return not self.same_steps and m.n >= MIN_PAIRS and m.value > 0 and not m.includes(1.0)

    @property
    def headline(self) -> str:
        if not self.measurable:
            return "No measurable difference"
        slower = " (lookahead slower)" if self.measured.value < 1 else ""
        return f"Speedup {self.measured.value:.2f}×{slower}"

    @property
    def explanation(self) -> str:
        """Why the headline says what it says: the range, the steps' prediction, the machine's part."""
        m = self.measured
        spread = f"{m.low:.2f}–{m.high:.2f}× over {m.n} pair{'s' if m.n != 1 else ''} of runs"
        predicted = f"; the steps predict {self.predicted:.2f}×" if self.predicted > 0 else ""
        if self.same_steps:
            return (
                f"lookahead took the same steps as plain ({self.lookahead.tokens_per_step:.2f} tokens per step), "
                f"so their times differ only by the machine (measured {m.value:.2f}×, {spread}{predicted})"
            )
        if m.n < MIN_PAIRS:
            return f"one pair of runs cannot say how far the times spread (measured {m.value:.2f}×{predicted})"
        if m.includes(1.0):
            return f"the repeats ranged {spread}, on both sides of 1.00×{predicted}"
        return f"{spread}{predicted}"

    @property
    def times(self) -> str:
        """Both runs' numbers, plain first (the left pane): what the panes' clocks and figures show."""
        p, la = self.plain, self.lookahead
        return (
            f"plain {p.n_tokens} tokens in {p.decode_s:.2f} s ({p.tokens_per_s:.1f} tok/s, "
            f"{p.tokens_per_step:.2f} tokens per step) · lookahead {la.n_tokens} tokens in {la.decode_s:.2f} s "
            f"({la.tokens_per_s:.1f} tok/s, {la.tokens_per_step:.2f} tokens per step); each decoder's median run, "
            "decoding only (the prompt's evaluation is the same for both)"
        )

    @property
    def notice(self) -> str:
        return BUSY_NOTE if self.busy else ""


def verdict_of(pairs: Sequence[Pair], plain: RunRecord, lookahead: RunRecord, busy: bool) -> Verdict:
    """The verdict on ``pairs`` whose median runs are ``plain`` and ``lookahead`` (``CompareResult.verdict``)."""
    value = speedup(plain.stats, lookahead.stats)
    ratios = [p.speedup for p in pairs] or [value]
    return Verdict(
        plain=plain.stats,
        lookahead=lookahead.stats,
        measured=RatioRange(value, min(*ratios, value), max(*ratios, value), len(pairs)),
        predicted=predicted_gain(plain.stats, lookahead.stats),
        same_steps=same_steps(plain.stats, lookahead.stats),
        busy=busy,
    )


@dataclass(frozen=True)
class CompareResult:
    """Every pair of runs, the run each pane replays, and what they say together."""

    request_id: int
    plain: RunRecord | None  # the plain pane's run: plain's median run (None if stopped before it ran)
    lookahead: RunRecord | None
    plain_first: bool
    lookahead_config: LookaheadConfig
    divergence: DivergenceMark | None = None
    cancelled: bool = False
    pairs: tuple[Pair, ...] = ()  # in the order they ran
    busy: bool = False  # another program held a core during some step (``engine.measure.ran_busy``)

    @property
    def complete(self) -> bool:
        return not self.cancelled and self.plain is not None and self.lookahead is not None

    @property
    def speedup(self) -> float:
        """Lookahead's median run against plain's, as ``engine.measure.speedup`` defines it (0.0 unless both ran)."""
        if self.plain is None or self.lookahead is None:
            return 0.0
        return speedup(self.plain.stats, self.lookahead.stats)

    @property
    def identical(self) -> bool:
        return (
            self.plain is not None
            and self.lookahead is not None
            and self.plain.stats.token_ids == self.lookahead.stats.token_ids
        )

    @property
    def verdict(self) -> Verdict | None:
        """What the comparison may claim (None unless it is complete)."""
        if not self.complete:
            return None
        assert self.plain is not None and self.lookahead is not None
        return verdict_of(self.pairs, self.plain, self.lookahead, self.busy)


def _median_record(records: Sequence[RunRecord]) -> RunRecord:
    middle = median_run([r.stats for r in records])
    return next(r for r in records if r.stats is middle)


def run_comparison(
    session: ChatSession,
    request: CompareRequest,
    cancel: threading.Event,
    on_progress: Callable[[CompareProgress], None] | None = None,
) -> CompareResult:
    """Run plain and lookahead in A-B-B-A turns, each from an empty cache, until ``repeats_done``.

    Call on the engine's thread. Setting ``cancel`` ends the run in flight at
    its next step; the pairs finished before it still make a result when there
    are ``MIN_PAIRS`` of them.
    """
    engine = session.engine
    fitted = session.fit(list(request.messages), request.stop.max_tokens)
    first, second = (PLAIN, LOOKAHEAD) if request.plain_first else (LOOKAHEAD, PLAIN)
    firsts: dict[str, RunRecord] = {}  # each decoder's first run: what a comparison stopped early shows
    pairs: list[Pair] = []
    planned_runs = expected = run = 0
    busy = False
    try:
        while not cancel.is_set():
            done: dict[str, RunRecord] = {}
            for phase in (first, second) if len(pairs) % 2 == 0 else (second, first):
                if cancel.is_set():
                    break
                controls = GenerationControls(
                    lookahead=request.lookahead if phase == LOOKAHEAD else None, cancel=cancel
                )
                events: list[StepEvent] = []
                n_tokens = 0
                engine.reset()  # the same cold start for every run: none reuses another's cache
                for ev in engine.generate(
                    fitted.tokens, controls, sampling=request.sampling, stop=request.stop, history=fitted.history
                ):
                    events.append(ev)
                    n_tokens += len(ev.token_ids)
                    if on_progress is not None:
                        on_progress(CompareProgress(request.request_id, phase, n_tokens, request.stop.max_tokens,
                                                    run, planned_runs, expected))
                record = RunRecord.from_events(events)
                firsts.setdefault(phase, record)
                busy = busy or ran_busy(events)
                if run == 0:
                    planned_runs, expected = 2 * planned_pairs(record.stats.elapsed_s), record.stats.n_tokens
                run += 1
                done[phase] = record
            if cancel.is_set():
                break  # the run in flight was cut short: its pair is no measurement
            pairs.append(Pair(done[PLAIN], done[LOOKAHEAD]))
            if repeats_done([p.speedup for p in pairs], planned_runs // 2):
                break
    finally:
        engine.reset()  # the chat's next turn must not reuse a cache that holds the comparison's reply
    if len(pairs) < MIN_PAIRS:
        return CompareResult(
            request_id=request.request_id,
            plain=firsts.get(PLAIN),
            lookahead=firsts.get(LOOKAHEAD),
            plain_first=request.plain_first,
            lookahead_config=request.lookahead,
            cancelled=True,
            pairs=tuple(pairs),
            busy=busy,
        )
    plain = _median_record([p.plain for p in pairs])
    lookahead = _median_record([p.lookahead for p in pairs])
    mark = None
    p, la = plain.stats, lookahead.stats
    div = first_divergence(p, la, engine.detokenize)
    if div is not None:
        mark = DivergenceMark(
            **div.as_dict(),
            plain_offset=min(len(engine.detokenize(p.token_ids[: div.index])), len(p.text)),
            lookahead_offset=min(len(engine.detokenize(la.token_ids[: div.index])), len(la.text)),
        )
    return CompareResult(
        request_id=request.request_id,
        plain=plain,
        lookahead=lookahead,
        plain_first=request.plain_first,
        lookahead_config=request.lookahead,
        divergence=mark,
        pairs=tuple(pairs),
        busy=busy,
    )


class ReplayTrack:
    """One run's steps on its own clock: which of them had happened ``t`` seconds into its decoding.

    Step ``i`` is shown once the clock passes the end of its measured time.
    The clock counts decoding only, as the speedup does: the prompt's
    evaluation is the same work for both decoders and the panes quote it
    apart, so a pane's clock stops at the time the verdict quotes.
    """

    def __init__(self, events: Sequence[StepEvent]) -> None:
        self.events = list(events)
        self.ends: list[float] = []
        t = 0.0
        for ev in self.events:
            t += ev.elapsed_s
            self.ends.append(t)

    @property
    def duration_s(self) -> float:
        return self.ends[-1] if self.ends else 0.0

    def done_by(self, t: float) -> int:
        """How many events had been emitted ``t`` seconds in."""
        return bisect.bisect_right(self.ends, t)

    def clock(self, t: float) -> float:
        """The run's own clock: stops at its last step."""
        return min(max(t, 0.0), self.duration_s)


# --- speed report ---


@dataclass(frozen=True)
class SpeedReportRequest:
    """Workloads to run, each through the same comparison as the panes (``run_comparison``)."""

    request_id: int
    workloads: tuple[Workload, ...]
    lookahead: LookaheadConfig
    system_prompt: str = ""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int = 64

    def comparison(self, workload: Workload, plain_first: bool) -> CompareRequest:
        messages = [Message("system", self.system_prompt)] if self.system_prompt.strip() else []
        messages.append(Message("user", workload.prompt))
        return CompareRequest(
            request_id=self.request_id,
            messages=tuple(messages),
            lookahead=self.lookahead,
            sampling=self.sampling,
            stop=StopConfig(max_tokens=self.max_tokens),
            plain_first=plain_first,
        )


def prompt_result(workload: Workload, result: CompareResult) -> PromptResult:
    """A finished comparison as a row of the speed report: ``engine bench``'s row, built the same way.

    Its runs are the comparison's median runs; ``extra`` carries what the
    verdict needs (the pairs' range, the steps' prediction, same steps, busy).
    """
    verdict = result.verdict
    assert verdict is not None and result.plain is not None and result.lookahead is not None
    m = verdict.measured
    return PromptResult.from_runs(
        workload,
        result.plain.stats,
        result.lookahead.stats,
        identical=result.identical,
        divergence=result.divergence,
        plain_first=result.plain_first,
        speedup_low=round(m.low, 4),
        speedup_high=round(m.high, 4),
        pairs=m.n,
        steps_predict=round(verdict.predicted, 4),
        same_steps=verdict.same_steps,
        measurable=verdict.measurable,
        busy=verdict.busy,
    )


def run_speed_report(
    session: ChatSession,
    request: SpeedReportRequest,
    cancel: threading.Event,
    on_result: Callable[[PromptResult], None] | None = None,
) -> list[PromptResult]:
    """Every workload through ``run_comparison``, alternating which decoder goes first; Stop ends the step in flight.

    Its rows are ``engine bench``'s: ``PromptResult.from_runs`` builds them and
    ``engine.measure.speedup`` gives their speedup, so the Compare tab, this
    report and ``engine bench`` compare the same two runs by one rule. Not
    ``engine.bench.run_bench`` itself, on purpose: this report is the Compare
    tab's comparison (A-B-B-A pairs until their ratio settles, with the chat's
    system prompt and sampling, its verdict per row) over many prompts, with a
    row per prompt as it ends; ``run_bench`` times each decoder by the fastest
    of up to eight greedy runs over at least 512 tokens (and adds the oracle
    bound), for the command line. Both stop within one step of ``cancel``, and
    a prompt measured in part is no row.
    """
    results: list[PromptResult] = []
    for k, workload in enumerate(request.workloads):
        if cancel.is_set():
            break
        comparison = request.comparison(workload, plain_first=k % 2 == 0)
        docs = [read_document(path) for path in workload.attach]
        if docs:  # as a chat message with these files attached: whole or their best passages, drafted from whole
            messages = list(comparison.messages)
            context = session.documents_context(messages, docs, request.max_tokens)
            messages[-1] = Message("user", with_documents(workload.prompt, context))
            comparison = replace(comparison, messages=tuple(messages))
        session.engine.set_documents([d.text for d in docs])
        try:
            result = run_comparison(session, comparison, cancel)
        finally:
            session.engine.set_documents([])
        if not result.complete or cancel.is_set():
            break
        row = prompt_result(workload, result)
        results.append(row)
        if on_result is not None:
            on_result(row)
    return results


@dataclass(frozen=True)
class SpeedReportProgress:
    request_id: int
    result: PromptResult
    done: int
    total: int


@dataclass(frozen=True)
class SpeedReportOutcome:
    request_id: int
    results: tuple[PromptResult, ...]
    total: int
    cancelled: bool
    error: str | None = None


PROMPT_COLUMNS = (
    "id", "category", "tokens", "plain tok/s", "lookahead tok/s", "speedup", "steps predict", "tokens/step",
    "identical",
)
CATEGORY_COLUMNS = (
    "category", "prompts", "speedup (geomean)", "steps predict (geomean)", "tokens/step (mean)", "identical",
)


def speedup_cell(r: PromptResult) -> str:
    """A row's speedup as the report shows it: claimed only where its repeats measured one."""
    if r.extra.get("same_steps"):
        return "same steps"
    if "speedup_low" not in r.extra:  # a row from before repeats were recorded: the one ratio there is
        return f"{r.speedup:.2f}×"
    range_ = f"{r.extra['speedup_low']:.2f}–{r.extra['speedup_high']:.2f}"
    if not r.extra.get("measurable"):
        return f"no difference ({range_}×)"
    return f"{r.speedup:.2f}× ({range_})"


def _predicted(r: PromptResult) -> float:
    return float(r.extra.get("steps_predict", 0.0))


def _ratio(x: float) -> str:
    return f"{x:.2f}×" if x > 0 else "–"


def prompt_cells(r: PromptResult) -> list[str]:
    return [
        r.id, r.cat, str(r.n_tokens), f"{r.plain_tps:.1f}", f"{r.lookahead_tps:.1f}", speedup_cell(r),
        _ratio(_predicted(r)), f"{r.tokens_per_step:.2f}", "yes" if r.identical else "no",
    ]


def predicted_by_category(results: Sequence[PromptResult]) -> dict[str, float]:
    """The steps' predicted gain per category (geometric mean), and over all of them under ``ALL``."""
    groups: dict[str, list[float]] = {}
    for r in results:
        groups.setdefault(r.cat, []).append(_predicted(r))
        groups.setdefault(ALL, []).append(_predicted(r))
    return {cat: geomean(values) for cat, values in groups.items()}


def category_cells(c: CategoryRow, predicted: float = 0.0) -> list[str]:
    return [c.cat, str(c.n), f"{c.speedup:.2f}×", _ratio(predicted), f"{c.tokens_per_step:.2f}",
            f"{c.identical}/{c.n}"]


def report_summary(results: Sequence[PromptResult]) -> str:
    """One paragraph over every row: the measured and the predicted gain, and what no row may claim."""
    if not results:
        return "No prompts measured."
    overall = by_category(results)[-1]
    predicted = predicted_by_category(results)[ALL]
    n = len(results)
    text = f"Lookahead {overall.speedup:.2f}× as fast as plain (geometric mean of {n} prompt{'s' if n != 1 else ''})"
    text += f"; the steps predict {predicted:.2f}×." if predicted > 0 else "."
    same = sum(bool(r.extra.get("same_steps")) for r in results)
    unclear = sum(not r.extra.get("measurable", True) and not r.extra.get("same_steps") for r in results)
    if same:
        text += f" {same} of {n} took the same steps as plain: no speedup to claim there."
    if unclear:
        text += f" {unclear} of {n} showed no measurable difference (their repeats spanned 1.00×)."
    if any(r.extra.get("busy") for r in results):
        text += f" {BUSY_NOTE}"
    return text


def report_csv(results: Sequence[PromptResult]) -> str:
    """One row per prompt, then one per category (its id column empty), as CSV."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "category", "tokens", "plain_tok_s", "lookahead_tok_s", "speedup", "tokens_per_step",
                     "identical", "plain_s", "lookahead_s", "speedup_low", "speedup_high", "pairs", "steps_predict",
                     "same_steps", "busy"])
    for r in results:
        x = r.extra
        writer.writerow([r.id, r.cat, r.n_tokens, r.plain_tps, r.lookahead_tps, r.speedup, r.tokens_per_step,
                         "yes" if r.identical else "no", r.plain_s, r.lookahead_s, x.get("speedup_low", ""),
                         x.get("speedup_high", ""), x.get("pairs", ""), x.get("steps_predict", ""),
                         _yes_no(x.get("same_steps")), _yes_no(x.get("busy"))])
    predicted = predicted_by_category(results)
    for c in by_category(results):
        writer.writerow(["", c.cat, "", "", "", round(c.speedup, 4), round(c.tokens_per_step, 3),
                         f"{c.identical}/{c.n}", "", "", "", "", "", round(predicted[c.cat], 4), "", ""])
    return out.getvalue()


def _yes_no(flag: object) -> str:
    return "" if flag is None else "yes" if flag else "no"


def report_markdown(results: Sequence[PromptResult], title: str = "Speed report") -> str:
    """The two tables (per prompt, per category) and the summary, as Markdown."""

    def table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        return lines

    predicted = predicted_by_category(results)
    lines = [f"## {title}", "", report_summary(results), ""]
    lines += table(PROMPT_COLUMNS, [prompt_cells(r) for r in results])
    lines += ["", "### By category", ""]
    lines += table(CATEGORY_COLUMNS, [category_cells(c, predicted[c.cat]) for c in by_category(results)])
    return "\n".join(lines) + "\n"
