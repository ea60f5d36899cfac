"""Calibrating this machine: what a forward pass costs here, and which batch sizes give a 1-token step's logits.

Drives an engine (anything with the parts ``Measurable`` names: ``engine.decoding.runtime.Engine`` is one)
through timed decodes of each batch size, and probes which sizes give bit-identical logits; the result is a
``CostCurve`` (engine/costs/curve.py), cached per model file, threads and CPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Protocol

import numpy as np

from engine.costs.contention import DecodeSample, RestProfile, waiting_share
from engine.costs.curve import CostCurve, load_cached, save_cached
from engine.costs.parts import EngineParts
from engine.llama.models import GgufSummary


class Measurable(EngineParts, Protocol):
    """What measuring needs of an engine besides its llama.cpp state: its model file, tokenizer, cache reset and
    prefill, and every thread.

    ``engine.decoding.runtime.Engine`` has these parts; naming them here keeps measuring from importing the
    engine that calls it.
    """

    threads_agree: bool | None  # a 1-thread step's logits equal an all-thread one's (the probe finds out)

    @property
    def summary(self) -> GgufSummary: ...

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...
    def reset(self) -> None: ...
    def all_threads(self) -> AbstractContextManager[None]: ...
    def prefill(
        self,
        tokens: Sequence[int],
        progress: Callable[[int, int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> int: ...


# Every size up to 16 is measured and probed: matmul kernels change with the row count (4-row and 16-row
# gemms, a gemv per leftover row, a tiled path from 8), so neither cost nor exactness can be interpolated there.
SIZES = (*range(1, 17), 24, 32, 48, 64)
_TABLE = 300
CACHE_VERSION = 9
EXACT_PROBE_SIZES = (*range(2, 17), 24, 32, 48, 63, 64, 96, 128)
# Before the first lookahead step of a model whose curve is unknown: cheap (a 300-token prompt, then 191
# batch tokens), covers every Auto draft and the common fixed shapes; the full probe runs with the measurement.
QUICK_PROBE_SIZES = (*range(2, 17), 24, 32)
# The one-thread curve's sizes stop here: steps on fewer threads are Auto's (up to LiveCosts.MAX_SIZE tokens).
ONE_THREAD_MAX_SIZE = 32


class MeasurementCancelled(Exception):
    """A measurement was stopped before it finished; ``max_exact_batch`` is kept when its probe had run."""

    def __init__(self, max_exact_batch: int | None, message: str = "the cost measurement was cancelled") -> None:
        super().__init__(message)
        self.max_exact_batch = max_exact_batch


class MachineBusy(MeasurementCancelled):
    """Another program took CPU time from the measurement: its times are not this PC's, so it stopped."""

    def __init__(self, max_exact_batch: int | None) -> None:
        super().__init__(max_exact_batch, "another program was using the CPU while this PC was being measured")


# A measurement stops (MachineBusy) once more than this share of its windows of decodes waited for cores
# (contention.waiting_share), checked after every round: a curve timed under load makes Auto plan for a
# slower machine than this one is, and would be kept for every later start.
BUSY_SHARE = 0.25


FILLER_TEXT = "The quick brown fox jumps over the lazy dog. " * 60
# The exact-batch probe runs past this many cached tokens: llama.cpp's CPU attention may switch kernels for a
# 1-token step once the cache passes 256 cells. Its batches' first CHAIN_ROWS rows are checked one by one.
PROBE_DEPTH = 300
CHAIN_ROWS = 8
PROBE_CHUNK = 50

# Share of a measurement's progress spent on the exact-batch probe (it runs first).
_PROBE_SHARE = 0.1


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

    def stop_if_cancelled() -> None:
        if cancel is not None and cancel.is_set():
            engine.reset()
            raise MeasurementCancelled(max_exact_batch)

    def report(fraction: float) -> None:
        stop_if_cancelled()
        if progress is not None:
            progress(min(max(fraction, 0.0), 1.0))

    filler = engine.tokenize(FILLER_TEXT, add_special=False)
    report(0.0)
    if max_exact_batch is None:
        share = 1.0 if pinned is not None else _PROBE_SHARE
        max_exact_batch = probe_exact_batch(engine, filler, lambda f: report(f * share))
        report(share)  # a probe that stopped at an inexact size skipped its larger ones
    engine.reset()
    agree = engine.threads_agree is not False
    if pinned is not None:
        report(1.0)
        return replace(pinned, max_exact_batch=max_exact_batch, threads_agree=agree)
    # The one-thread curve, for steps the governor runs on fewer threads, only where it may: it is cheaper
    # (fewer rounds, none of the largest sizes) and takes a third of what remains of the progress.
    one_too = agree and engine.n_threads > 1
    split = _PROBE_SHARE + (1 - _PROBE_SHARE) * (2 / 3 if one_too else 1.0)

    def part(lo: float, hi: float) -> Callable[[float], None]:
        return lambda f: report(lo + (hi - lo) * f)

    with engine.all_threads():
        curve, heard = _time_sizes(engine, filler, budget_s, sizes, part(_PROBE_SHARE, split), stop_if_cancelled,
                                    max_exact_batch, agree)
        one = None
        if one_too:
            engine.ctx.set_threads(1)
            one_sizes = tuple(n for n in sizes if n <= ONE_THREAD_MAX_SIZE)
            one, _ = _time_sizes(engine, filler, budget_s / 2, one_sizes, part(split, 1.0), stop_if_cancelled,
                                 max_exact_batch, agree, min_rounds=2)
    report(1.0)
    return replace(curve, one_thread=one, rest_floor=RestProfile.learn(heard).floor)


def _time_sizes(
    engine: Measurable,
    filler: list[int],
    budget_s: float,
    sizes: tuple[int, ...],
    report: Callable[[float], None],
    stop_if_cancelled: Callable[[], None],
    max_exact_batch: int,
    threads_agree: bool,
    min_rounds: int = 3,
) -> tuple[CostCurve, list[DecodeSample]]:
    """measure()'s timing part, with the thread count set now; stops with MachineBusy when the decodes waited
    for cores. Returns the curve and its 1-token decodes as the thread governor heard them.

    A cancel is looked at before every decode, not once per pair of three (the middle one up to 64 tokens with
    all logits): a reply asked for meanwhile waits for one decode at most. ``report`` hears 0..1.
    """
    n_kv = min(160, engine.n_ctx // 4)
    engine.prefill(filler[:n_kv], progress=lambda _done, _total: stop_if_cancelled())  # looked at per chunk
    sizes = tuple(s for s in sizes if s + n_kv + 1 < engine.n_ctx and s <= engine.ctx.n_batch)
    seqs = engine.commit_seqs
    if engine.drafts_only:  # what is timed is taken back after: no more than the memory can take back
        sizes = tuple(s for s in sizes if s <= engine.rollback)
    batch, ctx = engine.batch, engine.ctx
    ratios: dict[tuple[int, bool], list[float]] = {(n, a): [] for n in sizes for a in (False, True)}
    singles: list[float] = []
    t_start = time.perf_counter()
    decodes: list[DecodeSample] = []  # every decode timed, as the governor heard it
    heard: list[DecodeSample] = []  # the 1-token decodes, as the governor heard them: this PC at rest

    def once(n: int, all_logits: bool) -> float:
        stop_if_cancelled()
        batch.set_single_seq(filler[n_kv : n_kv + n], n_kv, seqs, last_logits=True)
        if all_logits:
            batch.logits[:n] = 1
        t0 = time.perf_counter()
        ctx.decode(batch)
        dt = time.perf_counter() - t0
        # On recurrent memory the state left is not the prefix's (a whole decode cannot be taken back), which
        # changes no time; engine.reset() clears it after.
        ctx.seq_rm(seqs[0] if engine.drafts_only else -1, n_kv, -1)
        last = engine.governor.last
        if last is not None:
            decodes.append(last)
            if n == 1:
                heard.append(last)
        return dt

    def timed_in(round_no: int) -> list[int]:
        """The sizes timed in this round: small ones every round, large ones every third."""
        return [n for n in sizes if n != 1 and not (n > 16 and round_no % 3)]

    # Progress: the share of the first min_rounds rounds' work done (each pair weighs its tokens plus the two
    # 1-token steps around it), or of the time budget if that is less; the loop ends once both are spent.
    def weight(n: int) -> float:
        return 2 + n / 8

    work_total = sum(weight(n) for r in range(min_rounds) for n in timed_in(r)) * 2 or 1.0
    work_done = 0.0

    def report_timing() -> None:
        share_of_time = (time.perf_counter() - t_start) / budget_s
        report(min(share_of_time, work_done / work_total, 1.0))

    for _ in range(3):  # warm-up
        once(1, True)
    rounds = 0
    while True:
        for n in timed_in(rounds):
            for a in (False, True):
                report_timing()
                # A batch can also slow the 1-token step after it (where llama.cpp builds the graph again):
                # that time is the batch's. Each pair starts after a 1-token step, as most steps do.
                one = once(1, True)
                singles.append(one)
                spent = once(n, a)
                spent += once(1, True) - one
                ratios[(n, a)].append(spent / one)
                work_done += weight(n) if rounds < min_rounds else 0.0
        rounds += 1
        if waiting_share(decodes) > BUSY_SHARE:
            engine.reset()
            raise MachineBusy(max_exact_batch)
        if rounds >= min_rounds and time.perf_counter() - t_start > budget_s:
            break
        if rounds >= 40:
            break
    engine.reset()
    report(1.0)
    med = {k: float(np.median(v)) if v else 1.0 for k, v in ratios.items()}
    last = np.maximum.accumulate([1.0 if n == 1 else med[(n, False)] for n in sizes])
    every = np.maximum.accumulate([1.0 if n == 1 else med[(n, True)] for n in sizes])
    every = np.maximum(every, last)
    return CostCurve(
        sizes=sizes,
        last_logit=tuple(round(float(x), 3) for x in last),
        all_logits=tuple(round(float(x), 3) for x in every),
        base_ms=round(float(np.median(singles)) * 1000, 3),
        threads=engine.ctx.n_threads,
        measured_s=round(time.perf_counter() - t_start, 2),
        max_exact_batch=max_exact_batch,
        threads_agree=threads_agree,
    ), heard


def probe_exact_batch(
    engine: Measurable,
    filler: list[int] | None = None,
    progress: Callable[[float], None] | None = None,
    sizes: tuple[int, ...] = EXACT_PROBE_SIZES,
) -> int:
    """Largest of ``sizes`` whose batches give the logits of plain decoding, bit for bit.

    Past a cache of ``PROBE_DEPTH`` tokens (kernels can change with the cache's
    length), a batch's first token must get a lone decode's logits with the
    rest of the batch in another sequence, as drafts are; and a batch of
    committed tokens must give each of its first ``CHAIN_ROWS`` tokens the
    logits that decoding them one at a time gives. Also finds whether one thread
    gives the same logits (``engine.threads_agree``). Leaves the engine's cache empty.
    """
    if filler is None:
        filler = engine.tokenize(FILLER_TEXT, add_special=False)
    with engine.all_threads():
        if engine.drafts_only:
            best = _probe_chain(engine, filler, progress, tuple(n for n in sizes if n <= engine.rollback + 1))
        else:
            best = _probe_sizes(engine, filler, progress, sizes)
    engine.reset()
    return best


class _ProbeSteps:
    """A probe's progress in steps of a known total (prefill pieces, single decodes, batches): it moves during
    every part, and a probe that stops early jumps to its end. Called before each step, with that step's weight;
    each call is also where a measurement's cancel takes effect."""

    def __init__(self, total: float, progress: Callable[[float], None] | None) -> None:
        self.total = total
        self.progress = progress
        self.done = 0.0

    def __call__(self, amount: float) -> None:
        if self.progress is not None:
            self.progress(min(self.done / self.total, 1.0))
        self.done += amount


def _read_prefix(engine: Measurable, prefix: list[int], step: _ProbeSteps) -> None:
    """Empty the cache, then read ``prefix`` in PROBE_CHUNK pieces, so that a cancel is never far off."""
    engine.reset()
    for i in range(0, len(prefix), PROBE_CHUNK):
        step(1)
        engine.prefill(prefix[i : i + PROBE_CHUNK], progress=lambda _done, _total: step(0))  # a cancel: per chunk


def _probe_chain(
    engine: Measurable, filler: list[int], progress: Callable[[float], None] | None, sizes: tuple[int, ...]
) -> int:
    """probe_exact_batch for a model that verifies one draft at a time (recurrent memory, ``drafts_only``).

    Such a memory cannot forget a whole batch, only take back its tail: so after the prefix, the filler's next
    tokens are decoded one at a time (the reference), the prefix is read again, and each size's batch starts
    where the cache ends, all its rows compared with the reference; taking back all but its first token leaves
    the cache one token further for the next size. A take-back that restored the wrong state shows as a
    mismatch in the next batch. Last, one batch on one thread decides ``engine.threads_agree``.
    """
    seq = engine.commit_seqs[0]
    batch, ctx = engine.batch, engine.ctx
    depth = max(0, min(PROBE_DEPTH, engine.n_ctx - 2 * (len(sizes) + max(sizes, default=1)) - CHAIN_ROWS - 2))
    n_ref = len(sizes) + max(sizes, default=1) + CHAIN_ROWS + 1
    prefix, ahead = filler[:depth], filler[depth : depth + n_ref]
    step = _ProbeSteps(2 * (len(prefix) / PROBE_CHUNK + 1) + len(ahead) + len(sizes) + 1, progress)
    _read_prefix(engine, prefix, step)
    reference: list[np.ndarray] = []
    for k, tok in enumerate(ahead):
        step(1)
        batch.set_single_seq([tok], depth + k, (seq,), last_logits=True)
        ctx.decode(batch)
        reference.append(ctx.logits_rows(1)[0].copy())
    _read_prefix(engine, prefix, step)

    def agrees(at: int, n: int) -> bool:
        """A batch of ``n`` filler tokens at ``depth + at`` gives the reference's rows; the cache then keeps its
        first token."""
        batch.set_single_seq(ahead[at : at + n], depth + at, (seq,), last_logits=False)
        batch.logits[:n] = 1
        ctx.decode(batch)
        rows = ctx.logits_rows(n)
        same = all(np.array_equal(rows[k], reference[at + k]) for k in range(n))
        ctx.rollback(seq, depth + at + 1)
        return same

    best, at = 0, 0
    for n in sizes:
        step(1)
        if n > batch.capacity or not agrees(at, n):
            break
        best, at = n, at + 1
    if engine.n_threads > 1 and best:
        step(1)
        ctx.set_threads(1)
        engine.threads_agree = agrees(at, min(best, CHAIN_ROWS))
        ctx.set_threads(engine.n_threads)
    elif engine.n_threads == 1:
        engine.threads_agree = True
    return best


def _all_seqs(engine: Measurable) -> tuple[int, ...]:
    """Every sequence of the engine's context: a probe's tokens belong to all of them, as committed tokens do."""
    return tuple(range(engine.ctx.n_seq_max))


def _probe_sizes(
    engine: Measurable, filler: list[int], progress: Callable[[float], None] | None, sizes: tuple[int, ...]
) -> int:
    seqs = _all_seqs(engine)
    batch, ctx = engine.batch, engine.ctx
    # A small context cannot hold the probe's depth: go as deep as it leaves room for the smallest batches
    # (a context that small never reaches the cache lengths where kernels change).
    prefix = filler[: max(0, min(PROBE_DEPTH, engine.n_ctx - CHAIN_ROWS - sizes[0] - 1))]
    best = 0
    # Steps: prefill pieces, chain tokens, then the sizes tried, each as heavy as its batch over a chunk's size.
    n_chunks = -(-len(prefix) // PROBE_CHUNK)
    step = _ProbeSteps(n_chunks + CHAIN_ROWS + sum(n / PROBE_CHUNK for n in sizes) * 2, progress)
    _read_prefix(engine, prefix, step)
    start = engine.kv.n
    chain = _decode_chain(engine, filler, start, before_decode=lambda: step(1))
    engine.threads_agree = _threads_agree(engine, filler, start, chain, before_decode=lambda: step(0))

    def decode(n: int, drafts: bool) -> np.ndarray:
        step(n / PROBE_CHUNK)  # also where a measurement's cancel takes effect: between two decodes
        ctx.seq_rm(-1, start, -1)
        batch.set_single_seq(filler[start : start + n], start, seqs, last_logits=False)
        if drafts:
            batch.n_seq_id[1:n] = 1
            batch.seq_matrix[1:n, 0] = 1  # the rest sit in another sequence, as drafts do
        batch.logits[:n] = 1
        ctx.decode(batch)
        return ctx.logits_rows(n)

    for n in sizes:
        if n > batch.capacity or start + n > min(len(filler), engine.n_ctx):
            break
        if not np.array_equal(decode(n, drafts=True)[0], chain[0]):
            break
        rows = decode(n, drafts=False)
        if not all(np.array_equal(rows[k], chain[k]) for k in range(min(n, CHAIN_ROWS))):
            break
        best = n
    return best


def probe_threads_agree(engine: Measurable, cancel: threading.Event | None = None) -> bool:
    """Whether one thread gives the logits all of them give (``engine.threads_agree``), alone: the part of the
    exact-batch probe the thread governor needs, at a fraction of its cost (a chunk of filler and ten decodes).
    Raises ``MeasurementCancelled`` between two decodes once ``cancel`` is set. Leaves the engine's cache empty.
    """
    def stop_if_cancelled() -> None:
        if cancel is not None and cancel.is_set():
            engine.reset()
            raise MeasurementCancelled(None, "the thread probe was cancelled")

    filler = engine.tokenize(FILLER_TEXT, add_special=False)
    with engine.all_threads():
        engine.reset()
        engine.prefill(filler[:PROBE_CHUNK])
        start = engine.kv.n
        chain = _decode_chain(engine, filler, start, before_decode=stop_if_cancelled)
        agree = _threads_agree(engine, filler, start, chain, before_decode=stop_if_cancelled)
    engine.reset()
    return agree


def _decode_chain(
    engine: Measurable, filler: list[int], start: int, before_decode: Callable[[], None]
) -> list[np.ndarray]:
    """Plain decoding's logits for the CHAIN_ROWS filler tokens after ``start``, one token at a time."""
    seqs = _all_seqs(engine)
    batch, ctx = engine.batch, engine.ctx
    chain: list[np.ndarray] = []
    for k in range(CHAIN_ROWS):
        before_decode()
        batch.set_single_seq(filler[start + k : start + k + 1], start + k, seqs, last_logits=True)
        ctx.decode(batch)
        chain.append(ctx.logits_rows(1)[0].copy())
    return chain


def _threads_agree(
    engine: Measurable, filler: list[int], start: int, chain: list[np.ndarray], before_decode: Callable[[], None]
) -> bool:
    """Whether one thread gives the logits ``chain`` holds (decoded with all of them), for a lone token past
    the probe's depth and for a batch of the chain's tokens."""
    seqs = _all_seqs(engine)
    if engine.n_threads < 2:
        return True
    batch, ctx = engine.batch, engine.ctx
    with engine.all_threads():
        ctx.set_threads(1)
        try:
            for n in (1, CHAIN_ROWS):
                before_decode()
                ctx.seq_rm(-1, start, -1)
                batch.set_single_seq(filler[start : start + n], start, seqs, last_logits=False)
                batch.logits[:n] = 1
                ctx.decode(batch)
                rows = ctx.logits_rows(n)
                if not all(np.array_equal(rows[k], chain[k]) for k in range(n)):
                    return False
        finally:
            ctx.seq_rm(-1, start, -1)
    return True


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
        cached = load_cached(engine.summary.path, engine.n_threads)
        if cached is not None:
            return cached, False
    curve = measure(engine, budget_s=budget_s, progress=progress, cancel=cancel, max_exact_batch=max_exact_batch)
    try:
        save_cached(engine.summary.path, engine.n_threads, curve)
    except OSError:
        pass  # a read-only cache dir only costs a re-measure next time
    return curve, True
