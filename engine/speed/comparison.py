"""Plain against lookahead on one prompt: the one way this project measures a speedup.

``engine bench``, the app's Compare tab, its speed report and the busy bench all
measure with this module, and all report what ``Verdict`` says: the ratio, the
range the repeats spread over, how many pairs, what the steps alone predict, and
"no measurable difference" where the repeats do not agree on a side of 1.0.

Fair timing: on a CPU two decoders running at once would compete for the same
cores, and the race would measure contention. So the two run one after the
other, each from an empty cache, in A-B-B-A turns (drift in the machine's speed
hits both alike), repeated until the pairs' speedups agree or the time planned
for them is spent. Each decoder is represented by its median run (a measured
run, not an average, so the times quoted are one run's), and the ratio of the
two median runs is the speedup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.decoding.generation import GenerationControls, StepEvent
from engine.decoding.grammar import Constraint
from engine.decoding.runtime import Engine
from engine.decoding.settings import LookaheadConfig, SamplingConfig, StopConfig
from engine.speed.rows import PromptResult, VerdictFigures
from engine.speed.run_stats import (
    Divergence,
    RatioRange,
    RunStats,
    first_divergence,
    lower_median,
    median_run,
    predicted_gain,
    ran_busy,
    ratio_range,
    same_steps,
    speedup,
)
from engine.speed.workloads import Workload

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


def whole_blocks(pairs: int) -> bool:
    """Whether ``pairs`` pairs of runs make whole A-B-B-A blocks, at least one (what ``exact_pairs`` may ask)."""
    return pairs >= MIN_PAIRS and pairs % 2 == 0


def repeats_done(ratios: Sequence[float], planned: int) -> bool:
    """True once the pairs run are enough: the plan is spent, or whole blocks agree within ``AGREE``."""
    n = len(ratios)
    if n >= planned:
        return True
    return n >= MIN_PAIRS and n % 2 == 0 and ratio_range(ratios).spread <= AGREE


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> RatioRange:
    """``num`` against ``den``, rates measured in pairs (``num[i]`` beside ``den[i]``): their ratio and range.

    The value is the ratio of the two median rates (the lower median: always a measured rate), the range the
    lowest and highest of the pairs' ratios and the value. A speedup, a busy/idle ratio: any two conditions
    timed in turns.
    """
    if not num or len(num) != len(den):
        raise ValueError("a paired ratio needs as many rates on each side, and at least one")

    middle = lower_median(den, float)
    value = lower_median(num, float) / middle if middle > 0 else 0.0
    ratios = [a / b if b > 0 else 0.0 for a, b in zip(num, den, strict=True)]
    return RatioRange(value, min(*ratios, value), max(*ratios, value), len(ratios))


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

    ``plain`` and ``lookahead`` are the median runs; every time and rate quoted
    is theirs. ``measured`` is their speedup with the lowest and highest of the
    pairs' speedups around it; ``predicted`` what the steps alone predict (0.0:
    the steps carry no cost).
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



def verdict_of(pairs: Sequence[Pair], busy: bool) -> Verdict:
    """The verdict on ``pairs``: the median runs' speedup, the pairs' range, the steps' prediction."""
    if not pairs:
        raise ValueError("no pairs to judge")
    plain = median_run([p.plain.stats for p in pairs])
    lookahead = median_run([p.lookahead.stats for p in pairs])
    measured = paired_ratio([p.lookahead.stats.tokens_per_s for p in pairs],
                            [p.plain.stats.tokens_per_s for p in pairs])
    return Verdict(
        plain=plain,
        lookahead=lookahead,
        measured=measured,
        predicted=predicted_gain(plain, lookahead),
        same_steps=same_steps(plain, lookahead),
        busy=busy,
    )


@dataclass(frozen=True)
class Comparison:
    """Every pair of runs, each decoder's median run (what a pane replays), and what they say together."""

    plain: RunRecord | None  # plain's median run (its first run if stopped before two pairs; None if none ran)
    lookahead: RunRecord | None
    plain_first: bool = True
    divergence: DivergenceMark | None = None
    cancelled: bool = False
    pairs: tuple[Pair, ...] = ()  # in the order they ran
    busy: bool = False  # another program held a core during some step (``engine.speed.run_stats.ran_busy``)

    @property
    def complete(self) -> bool:
        return not self.cancelled and self.plain is not None and self.lookahead is not None

    @property
    def speedup(self) -> float:
        """Lookahead's median run against plain's, by ``engine.speed.run_stats.speedup`` (0.0 unless both ran)."""
        if self.plain is None or self.lookahead is None:
            return 0.0
        return speedup(self.plain.stats, self.lookahead.stats)

    @property
    def identical(self) -> bool:
        """Every run wrote the same tokens (the median runs, when stopped early)."""
        if self.plain is None or self.lookahead is None:
            return False
        reference = self.plain.stats.token_ids
        runs = [r for p in self.pairs for r in (p.plain, p.lookahead)] or [self.lookahead]
        return all(r.stats.token_ids == reference for r in runs)

    @property
    def verdict(self) -> Verdict | None:
        """What the comparison may claim (None unless it is complete)."""
        if not self.complete:
            return None
        return verdict_of(self.pairs, self.busy)


def _record_of(records: Sequence[RunRecord], stats: RunStats) -> RunRecord:
    return next(r for r in records if r.stats is stats)


def compare_decoders(
    engine: Engine,
    prompt: Sequence[int],
    lookahead: LookaheadConfig | None,
    *,
    sampling: SamplingConfig | None = None,
    stop: StopConfig | None = None,
    history: Sequence[int] = (),
    plain_first: bool = True,
    cancel: threading.Event | None = None,
    on_progress: Callable[[CompareProgress], None] | None = None,
    request_id: int = 0,
    max_pairs: int | None = None,
    exact_pairs: int | None = None,
    constraint: Constraint | None = None,
) -> Comparison:
    """Plain and ``lookahead`` on ``prompt`` in A-B-B-A turns, each from an empty cache, until ``repeats_done``.

    ``lookahead`` None runs plain in both turns: the "speedup" is the machine's noise. Call on the engine's
    thread. Setting ``cancel`` ends the run in flight at its next step; the pairs finished before it still make a
    result when there are ``MIN_PAIRS`` of them. ``max_pairs`` (default ``MAX_PAIRS``) caps the pairs below the
    time plan (one pair: a single run of each, as a priced rather than timed bench needs). ``exact_pairs`` (whole
    A-B-B-A blocks) runs that many whether or not they agree, to pin one prompt's figure down further than the
    plan would. ``constraint``: the grammar both decoders' replies follow. The engine's cache is empty afterwards.
    """
    if exact_pairs is not None and not whole_blocks(exact_pairs):
        raise ValueError(f"exact_pairs must be whole A-B-B-A blocks of {MIN_PAIRS} pairs, not {exact_pairs}")
    cancel = cancel if cancel is not None else threading.Event()
    max_pairs = MAX_PAIRS if max_pairs is None else max_pairs
    sampling = sampling if sampling is not None else SamplingConfig()
    stop = stop if stop is not None else StopConfig()
    runs = _Runs(engine, prompt, sampling, stop, history, constraint, cancel, on_progress, request_id)
    first, second = (PLAIN, LOOKAHEAD) if plain_first else (LOOKAHEAD, PLAIN)
    pairs: list[Pair] = []
    try:
        while not cancel.is_set():
            done: dict[str, RunRecord] = {}
            for phase in (first, second) if len(pairs) % 2 == 0 else (second, first):
                if cancel.is_set():
                    break
                done[phase] = record = runs.run(phase, lookahead if phase == LOOKAHEAD else None)
                if runs.count == 1:
                    planned = min(planned_pairs(record.stats.elapsed_s), max_pairs)
                    runs.plan(2 * (exact_pairs if exact_pairs is not None else planned), record.stats.n_tokens)
            if cancel.is_set():
                break  # the run in flight was cut short: its pair is no measurement
            pairs.append(Pair(done[PLAIN], done[LOOKAHEAD]))
            if len(pairs) == exact_pairs or (exact_pairs is None and
                                             repeats_done([p.speedup for p in pairs], runs.planned // 2)):
                break
    finally:
        engine.reset()  # the next reply must not reuse a cache that holds the comparison's
    return _comparison_of(pairs, runs, min(MIN_PAIRS, max_pairs), plain_first, engine.detokenize)


class _Runs:
    """A comparison's runs, one after the other, each from an empty cache, their progress reported as they go.

    Keeps each decoder's first run (what a comparison stopped early shows) and whether any ran while another
    program used the CPU.
    """

    def __init__(
        self,
        engine: Engine,
        prompt: Sequence[int],
        sampling: SamplingConfig,
        stop: StopConfig,
        history: Sequence[int],
        constraint: Constraint | None,
        cancel: threading.Event,
        on_progress: Callable[[CompareProgress], None] | None,
        request_id: int,
    ) -> None:
        self._engine, self._prompt, self._history, self._constraint = engine, prompt, history, constraint
        self._sampling, self._stop, self._cancel = sampling, stop, cancel
        self._on_progress, self._request_id = on_progress, request_id
        self.count = 0  # runs done
        self.planned = 0  # runs planned at most; 0 until the first run has ended
        self._expected = 0  # the first run's tokens
        self.busy = False
        self.firsts: dict[str, RunRecord] = {}

    def plan(self, runs: int, expected_tokens: int) -> None:
        self.planned, self._expected = runs, expected_tokens

    def run(self, phase: str, lookahead: LookaheadConfig | None) -> RunRecord:
        """One run of ``phase``'s decoder (``lookahead`` None: plain); a cancel ends it at its next step."""
        controls = GenerationControls(lookahead=lookahead, cancel=self._cancel)
        events: list[StepEvent] = []
        n_tokens = 0
        self._engine.reset()  # the same cold start for every run: none reuses another's cache
        for ev in self._engine.generate(self._prompt, controls, sampling=self._sampling, stop=self._stop,
                                        history=self._history, constraint=self._constraint):
            events.append(ev)
            n_tokens += len(ev.token_ids)
            if self._on_progress is not None:
                self._on_progress(CompareProgress(self._request_id, phase, n_tokens, self._stop.max_tokens,
                                                  self.count, self.planned, self._expected))
        record = RunRecord.from_events(events)
        self.firsts.setdefault(phase, record)
        self.busy = self.busy or ran_busy(events)
        self.count += 1
        return record


def _comparison_of(
    pairs: list[Pair], runs: _Runs, min_pairs: int, plain_first: bool, detokenize: Callable[[Sequence[int]], str]
) -> Comparison:
    """The finished comparison: its median runs and where they differ, or, with fewer than ``min_pairs``, a
    cancelled one showing each decoder's first run."""
    if len(pairs) < min_pairs:
        return Comparison(plain=runs.firsts.get(PLAIN), lookahead=runs.firsts.get(LOOKAHEAD), plain_first=plain_first,
                          cancelled=True, pairs=tuple(pairs), busy=runs.busy)
    verdict = verdict_of(pairs, runs.busy)
    plain = _record_of([p.plain for p in pairs], verdict.plain)
    la = _record_of([p.lookahead for p in pairs], verdict.lookahead)
    return Comparison(plain=plain, lookahead=la, plain_first=plain_first,
                      divergence=divergence_mark(plain.stats, la.stats, detokenize), pairs=tuple(pairs),
                      busy=runs.busy)


def divergence_mark(
    plain: RunStats, lookahead: RunStats, detokenize: Callable[[Sequence[int]], str]
) -> DivergenceMark | None:
    """Where the two replies first differ, with the character offset of that token in each reply's text."""
    div = first_divergence(plain, lookahead, detokenize)
    if div is None:
        return None
    return DivergenceMark(
        **div.as_dict(),
        plain_offset=min(len(detokenize(plain.token_ids[: div.index])), len(plain.text)),
        lookahead_offset=min(len(detokenize(lookahead.token_ids[: div.index])), len(lookahead.text)),
    )


def prompt_result(workload: Workload, comparison: Comparison) -> PromptResult:
    """A finished comparison as a row of ``engine bench`` and of the speed report (one builder for both).

    Its runs are the comparison's median runs; ``verdict`` holds what the verdict adds (the pairs' range, the
    steps' prediction, same steps, measurable, busy).
    """
    verdict = comparison.verdict
    assert verdict is not None
    m = verdict.measured
    figures = VerdictFigures(
        plain_first=comparison.plain_first,
        speedup_low=round(m.low, 4),
        speedup_high=round(m.high, 4),
        pairs=m.n,
        steps_predict=round(verdict.predicted, 4),
        same_steps=verdict.same_steps,
        measurable=verdict.measurable,
        busy=verdict.busy,
    )
    return PromptResult.from_runs(workload, verdict.plain, verdict.lookahead, identical=comparison.identical,
                                  divergence=comparison.divergence, verdict=figures)
