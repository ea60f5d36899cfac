"""Plain against lookahead on the same prompt: the measurement, the replay clock, the speed report's tables.

No Qt here. ``run_comparison`` and ``run_speed_report`` run on the worker
thread (it owns the engine); everything else is pure and tested without a model.

Fair timing: on a CPU two decoders running at once would compete for the same
cores, and the race would measure contention. So the two run one after the
other, each from an empty cache, and the window replays both at the pace each
one's steps were measured at. Which one runs first alternates between
comparisons, so a drift in the machine's speed favours neither.
"""

from __future__ import annotations

import bisect
import csv
import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
from engine.measure import CategoryRow, Divergence, PromptResult, Workload, by_category, first_divergence, speedup

FAIRNESS_NOTE = "Runs one after the other, replayed at measured speed, so the two never compete for the CPU."

PLAIN = "plain"
LOOKAHEAD = "lookahead"


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
    """Sent while measuring (the window shows it; the replay comes after)."""

    request_id: int
    phase: str  # PLAIN or LOOKAHEAD
    n_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class RunRecord:
    """One decoder's measured run: every step event, in order (for the replay), and their statistics."""

    events: tuple[StepEvent, ...]
    stats: RunStats

    @classmethod
    def from_events(cls, events: Sequence[StepEvent]) -> RunRecord:
        return cls(tuple(events), RunStats.of(events))


@dataclass(frozen=True)
class DivergenceMark(Divergence):
    """Where the two replies first differ, also located in each reply's text for highlighting."""

    plain_offset: int  # character offset of the divergent token in the plain text
    lookahead_offset: int


@dataclass(frozen=True)
class CompareResult:
    """Both runs, and what they say together."""

    request_id: int
    plain: RunRecord | None  # None if stopped before it ran
    lookahead: RunRecord | None
    plain_first: bool
    lookahead_config: LookaheadConfig
    divergence: DivergenceMark | None = None
    cancelled: bool = False

    @property
    def complete(self) -> bool:
        return not self.cancelled and self.plain is not None and self.lookahead is not None

    @property
    def speedup(self) -> float:
        """Lookahead against plain, as ``engine.measure.speedup`` defines it (0.0 unless both ran)."""
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


def run_comparison(
    session: ChatSession,
    request: CompareRequest,
    cancel: threading.Event,
    on_progress: Callable[[CompareProgress], None] | None = None,
) -> CompareResult:
    """Run plain and lookahead one after the other, each from an empty cache (call on the engine's thread)."""
    engine = session.engine
    fitted = session.fit(list(request.messages), request.stop.max_tokens)
    order = [PLAIN, LOOKAHEAD] if request.plain_first else [LOOKAHEAD, PLAIN]
    runs: dict[str, RunRecord] = {}
    for phase in order:
        if cancel.is_set():
            break
        controls = GenerationControls(lookahead=request.lookahead if phase == LOOKAHEAD else None, cancel=cancel)
        events: list[StepEvent] = []
        n_tokens = 0
        engine.reset()  # the same cold start for both: neither reuses the other's cache
        for ev in engine.generate(
            fitted.tokens, controls, sampling=request.sampling, stop=request.stop, history=fitted.history
        ):
            events.append(ev)
            n_tokens += len(ev.token_ids)
            if on_progress is not None:
                on_progress(CompareProgress(request.request_id, phase, n_tokens, request.stop.max_tokens))
        runs[phase] = RunRecord.from_events(events)
    engine.reset()  # the chat's next turn must not reuse a cache that holds the comparison's reply
    cancelled = cancel.is_set() or len(runs) < 2
    plain, lookahead = runs.get(PLAIN), runs.get(LOOKAHEAD)
    mark = None
    if plain is not None and lookahead is not None:
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
        cancelled=cancelled,
    )


class ReplayTrack:
    """One run's steps on its own clock: which of them had happened ``t`` seconds after it started.

    Step ``i`` is shown once the clock passes the end of its measured time
    (the prompt's evaluation counts before the first step, as it did live).
    """

    def __init__(self, events: Sequence[StepEvent]) -> None:
        self.events = list(events)
        self.ends: list[float] = []
        t = 0.0
        for ev in self.events:
            t += ev.prefill_s + ev.elapsed_s
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
    """A finished comparison as a row of the speed report: ``engine bench``'s row, built the same way."""
    assert result.plain is not None and result.lookahead is not None
    return PromptResult.from_runs(
        workload,
        result.plain.stats,
        result.lookahead.stats,
        identical=result.identical,
        divergence=result.divergence,
        plain_first=result.plain_first,
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
    tab's comparison (one run of each decoder, with the chat's system prompt
    and sampling) over many prompts, as quick as that many comparisons, with a
    row per prompt as it ends; ``run_bench`` times each decoder by the fastest
    of up to eight greedy A-B-B-A runs (and adds the oracle bound), several
    times longer, for the command line. Both stop within one step of ``cancel``.
    """
    results: list[PromptResult] = []
    for k, workload in enumerate(request.workloads):
        if cancel.is_set():
            break
        result = run_comparison(session, request.comparison(workload, plain_first=k % 2 == 0), cancel)
        if not result.complete:
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


PROMPT_COLUMNS = ("id", "category", "tokens", "plain tok/s", "lookahead tok/s", "speedup", "tokens/step", "identical")
CATEGORY_COLUMNS = ("category", "prompts", "speedup (geomean)", "tokens/step (mean)", "identical")


def prompt_cells(r: PromptResult) -> list[str]:
    return [
        r.id, r.cat, str(r.n_tokens), f"{r.plain_tps:.1f}", f"{r.lookahead_tps:.1f}",
        f"{r.speedup:.2f}×", f"{r.tokens_per_step:.2f}", "yes" if r.identical else "no",
    ]


def category_cells(c: CategoryRow) -> list[str]:
    return [c.cat, str(c.n), f"{c.speedup:.2f}×", f"{c.tokens_per_step:.2f}", f"{c.identical}/{c.n}"]


def report_csv(results: Sequence[PromptResult]) -> str:
    """One row per prompt, then one per category (its id column empty), as CSV."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "category", "tokens", "plain_tok_s", "lookahead_tok_s", "speedup", "tokens_per_step",
                     "identical", "plain_s", "lookahead_s"])
    for r in results:
        writer.writerow([r.id, r.cat, r.n_tokens, r.plain_tps, r.lookahead_tps, r.speedup, r.tokens_per_step,
                         "yes" if r.identical else "no", r.plain_s, r.lookahead_s])
    for c in by_category(results):
        writer.writerow(["", c.cat, "", "", "", round(c.speedup, 4), round(c.tokens_per_step, 3),
                         f"{c.identical}/{c.n}", "", ""])
    return out.getvalue()


def report_markdown(results: Sequence[PromptResult], title: str = "Speed report") -> str:
    """The two tables (per prompt, per category) as Markdown."""

    def table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        return lines

    lines = [f"## {title}", ""]
    lines += table(PROMPT_COLUMNS, [prompt_cells(r) for r in results])
    lines += ["", "### By category", ""]
    lines += table(CATEGORY_COLUMNS, [category_cells(c) for c in by_category(results)])
    return "\n".join(lines) + "\n"
