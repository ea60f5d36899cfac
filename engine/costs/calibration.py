"""Calibrating this machine: what a forward pass costs here, relative to a 1-token step.

Drives an engine's parts (``Measurable``, parts.py: ``engine.decoding.runtime.Engine`` has them) through timed
decodes of each batch size, after the probe of which sizes give bit-identical logits (exactness.py); the result
is a ``CostCurve`` (engine/costs/curve.py), cached per model file, threads and CPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from engine.costs.contention import DecodeSample, RestProfile, waiting_share
from engine.costs.curve import CostCurve, load_cached, save_cached
from engine.costs.exactness import MeasurementCancelled, filler_tokens, probe_exact_batch
from engine.costs.parts import Measurable

# Every size up to 16 is measured and probed: matmul kernels change with the row count (4-row and 16-row
# gemms, a gemv per leftover row, a tiled path from 8), so neither cost nor exactness can be interpolated there.
SIZES = (*range(1, 17), 24, 32, 48, 64)
# The one-thread curve's sizes stop here: steps on fewer threads are Auto's (up to LiveCosts.MAX_SIZE tokens).
ONE_THREAD_MAX_SIZE = 32


class MachineBusy(MeasurementCancelled):
    """Another program took CPU time from the measurement: its times are not this PC's, so it stopped."""

    def __init__(self, max_exact_batch: int | None) -> None:
        super().__init__(max_exact_batch, "another program was using the CPU while this PC was being measured")


# A measurement stops (MachineBusy) once more than this share of its windows of decodes waited for cores
# (contention.waiting_share), checked after every round: a curve timed under load makes Auto plan for a
# slower machine than this one is, and would be kept for every later start.
BUSY_SHARE = 0.25

# Share of a measurement's progress spent on the exact-batch probe (it runs first).
_PROBE_SHARE = 0.1
WARM_UP = 3  # 1-token steps before the first timed pair
MAX_ROUNDS = 40


class _Run:
    """A measurement's progress and cancel: ``report`` hears 0..1 and is where a cancel takes effect.

    A cancel empties the cache and raises ``MeasurementCancelled`` with the exact-batch cap once the probe found it.
    """

    def __init__(
        self,
        engine: Measurable,
        progress: Callable[[float], None] | None,
        cancel: threading.Event | None,
        max_exact_batch: int | None,
    ) -> None:
        self._engine = engine
        self._progress = progress
        self._cancel = cancel
        self.max_exact_batch = max_exact_batch

    def stop_if_cancelled(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            self._engine.cache.reset()
            raise MeasurementCancelled(self.max_exact_batch)

    def report(self, fraction: float) -> None:
        self.stop_if_cancelled()
        if self._progress is not None:
            self._progress(min(max(fraction, 0.0), 1.0))

    def part(self, lo: float, hi: float) -> Callable[[float], None]:
        """``report`` for a part of the measurement that runs from ``lo`` to ``hi`` of the whole."""
        return lambda f: self.report(lo + (hi - lo) * f)


def measure(
    engine: Measurable,
    budget_s: float = 6.0,
    sizes: tuple[int, ...] = SIZES,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
    max_exact_batch: int | None = None,
    pinned: CostCurve | None = None,
) -> CostCurve:
    """Time decode steps of every size, with one and with all logits, relative to a 1-token step.

    Each timed batch is paired with a 1-token step decoded just before it, as
    in a generation, and charged with the time the 1-token step after it takes
    beyond that one; the curve holds the median of those ratios: a machine
    whose speed drifts, or another process taking the CPU for a moment, moves
    both halves of a pair alike. Small batches, the ones Auto uses most, are
    timed every round, large ones every third round. The cache holds as many
    tokens as a chat reply sees. Leaves the engine's cache empty.

    The exact-batch probe runs first (skipped when ``max_exact_batch`` is
    given). With ``pinned``, nothing is timed: that curve is returned with the
    probe's cap. ``progress`` hears 0..1; setting ``cancel`` stops the measurement
    between two decodes with ``MeasurementCancelled``, and another program taking
    CPU time from it stops it with ``MachineBusy`` (nothing measured is kept).
    """
    run = _Run(engine, progress, cancel, max_exact_batch)
    filler = filler_tokens(engine)
    run.report(0.0)
    if run.max_exact_batch is None:
        share = 1.0 if pinned is not None else _PROBE_SHARE
        run.max_exact_batch = probe_exact_batch(engine, filler, run.part(0.0, share))
        run.report(share)  # a probe that stopped at an inexact size skipped its larger ones
    cap = run.max_exact_batch
    engine.cache.reset()
    agree = engine.costs.threads_agree is not False
    if pinned is not None:
        run.report(1.0)
        return replace(pinned, max_exact_batch=cap, threads_agree=agree)
    # The one-thread curve, for steps the governor runs on fewer threads, only where it may: it is cheaper
    # (fewer rounds, none of the largest sizes) and takes a third of what remains of the progress.
    one_too = agree and engine.loaded.n_threads > 1
    split = _PROBE_SHARE + (1 - _PROBE_SHARE) * (2 / 3 if one_too else 1.0)
    with engine.costs.all_threads():
        curve, heard = _time_sizes(engine, filler, budget_s, sizes, run.part(_PROBE_SHARE, split), run, cap, agree)
        one = None
        if one_too:
            engine.loaded.ctx.set_threads(1)
            one_sizes = tuple(n for n in sizes if n <= ONE_THREAD_MAX_SIZE)
            one, _ = _time_sizes(engine, filler, budget_s / 2, one_sizes, run.part(split, 1.0), run, cap, agree,
                                 min_rounds=2)
    run.report(1.0)
    return replace(curve, one_thread=one, rest_floor=RestProfile.learn(heard).floor)


class _PairTimer:
    """Timed decodes after a cache of ``n_kv`` filler tokens, each taken back after it; every decode is also
    kept as the thread governor heard it (``decodes``; ``heard``: the 1-token ones, this PC at rest)."""

    def __init__(self, engine: Measurable, filler: list[int], n_kv: int, stop_if_cancelled: Callable[[], None]):
        loaded = engine.loaded
        self._batch, self._ctx, self._seqs = loaded.batch, loaded.ctx, loaded.commit_seqs
        self._drafts_only = loaded.drafts_only
        self._costs = engine.costs
        self._filler, self._n_kv = filler, n_kv
        self._stop_if_cancelled = stop_if_cancelled
        self.decodes: list[DecodeSample] = []
        self.heard: list[DecodeSample] = []

    def once(self, n: int, all_logits: bool) -> float:
        """One decode of ``n`` filler tokens (logits on the last or on all), taken back after: its seconds."""
        self._stop_if_cancelled()
        batch, n_kv = self._batch, self._n_kv
        batch.set_single_seq(self._filler[n_kv : n_kv + n], n_kv, self._seqs, last_logits=True)
        if all_logits:
            batch.logits[:n] = 1
        t0 = time.perf_counter()
        self._ctx.decode(batch)
        dt = time.perf_counter() - t0
        # On recurrent memory the state left is not the prefix's (a whole decode cannot be taken back), which
        # changes no time; the cache is reset after.
        self._ctx.seq_rm(self._seqs[0] if self._drafts_only else -1, n_kv, -1)
        last = self._costs.governor.last
        if last is not None:
            self.decodes.append(last)
            if n == 1:
                self.heard.append(last)
        return dt

    def pair(self, n: int, all_logits: bool) -> tuple[float, float]:
        """A batch of ``n`` between two 1-token steps: (the first step's seconds, the batch's cost in steps).

        A batch can also slow the 1-token step after it (where llama.cpp builds the graph again): that time is
        the batch's. Each pair starts after a 1-token step, as most steps do.
        """
        one = self.once(1, True)
        spent = self.once(n, all_logits)
        spent += self.once(1, True) - one
        return one, spent / one


class _Rounds:
    """A timing's rounds: the sizes each one times (small ones every round, large ones every third), when they
    end, and its progress.

    Progress is the share of the first ``min_rounds`` rounds' work done (each pair weighs its tokens plus the two
    1-token steps around it), or of the time budget if that is less; the rounds end once both are spent.
    """

    def __init__(
        self, sizes: tuple[int, ...], budget_s: float, min_rounds: int, report: Callable[[float], None]
    ) -> None:
        self._sizes = sizes
        self._budget_s = budget_s
        self._min_rounds = min_rounds
        self._report = report
        self._t_start = time.perf_counter()
        self.number = 0
        self._work_total = sum(_weight(n) for r in range(min_rounds) for n in self.sizes_in(r)) * 2 or 1.0
        self._work_done = 0.0

    def sizes_in(self, round_no: int) -> list[int]:
        return [n for n in self._sizes if n != 1 and not (n > 16 and round_no % 3)]

    def report(self) -> None:
        share_of_time = self.elapsed() / self._budget_s
        self._report(min(share_of_time, self._work_done / self._work_total, 1.0))

    def pair_done(self, n: int) -> None:
        self._work_done += _weight(n) if self.number < self._min_rounds else 0.0

    def last_one(self) -> bool:
        """Ends a round; True when no other follows."""
        self.number += 1
        spent = self.number >= self._min_rounds and self.elapsed() > self._budget_s
        return spent or self.number >= MAX_ROUNDS

    def elapsed(self) -> float:
        return time.perf_counter() - self._t_start


def _weight(n: int) -> float:
    return 2 + n / 8


def _time_sizes(
    engine: Measurable,
    filler: list[int],
    budget_s: float,
    sizes: tuple[int, ...],
    report: Callable[[float], None],
    run: _Run,
    max_exact_batch: int,
    threads_agree: bool,
    min_rounds: int = 3,
) -> tuple[CostCurve, list[DecodeSample]]:
    """measure()'s timing part, with the thread count set now; stops with MachineBusy when the decodes waited
    for cores. Returns the curve and its 1-token decodes as the thread governor heard them.

    A cancel is looked at before every decode, not once per pair of three (the middle one up to 64 tokens with
    all logits): a reply asked for meanwhile waits for one decode at most. ``report`` hears 0..1.
    """
    loaded = engine.loaded
    n_kv = min(160, loaded.n_ctx // 4)
    engine.cache.prefill(filler[:n_kv], progress=lambda _done, _total: run.stop_if_cancelled())  # looked at per chunk
    sizes = tuple(s for s in sizes if s + n_kv + 1 < loaded.n_ctx and s <= loaded.ctx.n_batch)
    if loaded.drafts_only:  # what is timed is taken back after: no more than the memory can take back
        sizes = tuple(s for s in sizes if s <= loaded.rollback)
    ratios: dict[tuple[int, bool], list[float]] = {(n, a): [] for n in sizes for a in (False, True)}
    singles: list[float] = []
    rounds = _Rounds(sizes, budget_s, min_rounds, report)
    timer = _PairTimer(engine, filler, n_kv, run.stop_if_cancelled)
    for _ in range(WARM_UP):
        timer.once(1, True)
    while True:
        for n in rounds.sizes_in(rounds.number):
            for a in (False, True):
                rounds.report()
                one, ratio = timer.pair(n, a)
                singles.append(one)
                ratios[(n, a)].append(ratio)
                rounds.pair_done(n)
        if waiting_share(timer.decodes) > BUSY_SHARE:
            engine.cache.reset()
            raise MachineBusy(max_exact_batch)
        if rounds.last_one():
            break
    engine.cache.reset()
    report(1.0)
    curve = _curve_of(sizes, ratios, singles, threads=loaded.ctx.n_threads, measured_s=round(rounds.elapsed(), 2),
                      max_exact_batch=max_exact_batch, threads_agree=threads_agree)
    return curve, timer.heard


def _curve_of(
    sizes: tuple[int, ...],
    ratios: dict[tuple[int, bool], list[float]],
    singles: list[float],
    *,
    threads: int,
    measured_s: float,
    max_exact_batch: int,
    threads_agree: bool,
) -> CostCurve:
    """The timed ratios' medians as a curve that never falls with the size (all logits never below one)."""
    med = {k: float(np.median(v)) if v else 1.0 for k, v in ratios.items()}
    last = np.maximum.accumulate([1.0 if n == 1 else med[(n, False)] for n in sizes])
    every = np.maximum.accumulate([1.0 if n == 1 else med[(n, True)] for n in sizes])
    every = np.maximum(every, last)
    return CostCurve(
        sizes=sizes,
        last_logit=tuple(round(float(x), 3) for x in last),
        all_logits=tuple(round(float(x), 3) for x in every),
        base_ms=round(float(np.median(singles)) * 1000, 3),
        threads=threads,
        measured_s=measured_s,
        max_exact_batch=max_exact_batch,
        threads_agree=threads_agree,
    )


def curve_for(
    engine: Measurable,
    refresh: bool = False,
    budget_s: float = 6.0,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
    max_exact_batch: int | None = None,
) -> tuple[CostCurve, bool]:
    """The cached curve for this model/threads/CPU, measuring it when missing. Returns (curve, measured_now)."""
    if not refresh:
        cached = load_cached(engine.loaded.summary.path, engine.loaded.n_threads)
        if cached is not None:
            return cached, False
    curve = measure(engine, budget_s=budget_s, progress=progress, cancel=cancel, max_exact_batch=max_exact_batch)
    try:
        save_cached(engine.loaded.summary.path, engine.loaded.n_threads, curve)
    except OSError:
        pass  # a read-only cache dir only costs a re-measure next time
    return curve, True
