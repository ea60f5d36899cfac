"""Which batch sizes give a 1-token step's logits, bit for bit, and whether one thread gives every thread's.

Lookahead keeps a reply identical to plain decoding only where a batch row gets the logits a lone decode gets:
the matmul kernels change with the row count, so every size is probed (``probe_exact_batch``), past a cache
deep enough that attention's kernels are the ones a reply meets. The thread governor may change the thread
count only where that changes no logit (``probe_threads_agree``). Drives an engine's parts (``Measurable``,
parts.py); calibration.py runs the probe before it times anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from engine.costs.parts import Measurable

EXACT_PROBE_SIZES = (*range(2, 17), 24, 32, 48, 63, 64, 96, 128)
# Before the first lookahead step of a model whose curve is unknown: cheap (a 300-token prompt, then 191
# batch tokens), covers every Auto draft and the common fixed shapes; the full probe runs with the measurement.
QUICK_PROBE_SIZES = (*range(2, 17), 24, 32)

FILLER_TEXT = "The quick brown fox jumps over the lazy dog. " * 60
# The exact-batch probe runs past this many cached tokens: llama.cpp's CPU attention may switch kernels for a
# 1-token step once the cache passes 256 cells. Its batches' first CHAIN_ROWS rows are checked one by one.
PROBE_DEPTH = 300
CHAIN_ROWS = 8
PROBE_CHUNK = 50


class MeasurementCancelled(Exception):
    """A measurement was stopped before it finished; ``max_exact_batch`` is kept when its probe had run."""

    def __init__(self, max_exact_batch: int | None, message: str = "the cost measurement was cancelled") -> None:
        super().__init__(message)
        self.max_exact_batch = max_exact_batch


def filler_tokens(engine: Measurable) -> list[int]:
    """``FILLER_TEXT`` in the engine's tokens: what probes and timings decode."""
    return engine.loaded.model.tokenize(FILLER_TEXT, add_special=False, parse_special=True)


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
    gives the same logits (``engine.costs.threads_agree``). Leaves the engine's cache empty.
    """
    if filler is None:
        filler = filler_tokens(engine)
    loaded = engine.loaded
    with engine.costs.all_threads():
        if loaded.drafts_only:
            best = _probe_chain(engine, filler, progress, tuple(n for n in sizes if n <= loaded.rollback + 1))
        else:
            best = _probe_sizes(engine, filler, progress, sizes)
    engine.cache.reset()
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
    engine.cache.reset()
    for i in range(0, len(prefix), PROBE_CHUNK):
        step(1)
        engine.cache.prefill(prefix[i : i + PROBE_CHUNK], progress=lambda _done, _total: step(0))  # a cancel: per chunk


def _probe_chain(
    engine: Measurable, filler: list[int], progress: Callable[[float], None] | None, sizes: tuple[int, ...]
) -> int:
    """probe_exact_batch for a model that verifies one draft at a time (recurrent memory, ``drafts_only``).

    Such a memory cannot forget a whole batch, only take back its tail: so after the prefix, the filler's next
    tokens are decoded one at a time (the reference), the prefix is read again, and each size's batch starts
    where the cache ends, all its rows compared with the reference; taking back all but its first token leaves
    the cache one token further for the next size. A take-back that restored the wrong state shows as a
    mismatch in the next batch. Last, one batch on one thread decides ``engine.costs.threads_agree``.
    """
    loaded = engine.loaded
    seq = loaded.commit_seqs[0]
    batch, ctx = loaded.batch, loaded.ctx
    depth = max(0, min(PROBE_DEPTH, loaded.n_ctx - 2 * (len(sizes) + max(sizes, default=1)) - CHAIN_ROWS - 2))
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
    if loaded.n_threads > 1 and best:
        step(1)
        ctx.set_threads(1)
        engine.costs.threads_agree = agrees(at, min(best, CHAIN_ROWS))
        ctx.set_threads(loaded.n_threads)
    elif loaded.n_threads == 1:
        engine.costs.threads_agree = True
    return best


def _all_seqs(engine: Measurable) -> tuple[int, ...]:
    """Every sequence of the engine's context: a probe's tokens belong to all of them, as committed tokens do."""
    return tuple(range(engine.loaded.ctx.n_seq_max))


def _probe_sizes(
    engine: Measurable, filler: list[int], progress: Callable[[float], None] | None, sizes: tuple[int, ...]
) -> int:
    seqs = _all_seqs(engine)
    loaded = engine.loaded
    batch, ctx = loaded.batch, loaded.ctx
    # A small context cannot hold the probe's depth: go as deep as it leaves room for the smallest batches
    # (a context that small never reaches the cache lengths where kernels change).
    prefix = filler[: max(0, min(PROBE_DEPTH, loaded.n_ctx - CHAIN_ROWS - sizes[0] - 1))]
    best = 0
    # Steps: prefill pieces, chain tokens, then the sizes tried, each as heavy as its batch over a chunk's size.
    n_chunks = -(-len(prefix) // PROBE_CHUNK)
    step = _ProbeSteps(n_chunks + CHAIN_ROWS + sum(n / PROBE_CHUNK for n in sizes) * 2, progress)
    _read_prefix(engine, prefix, step)
    start = engine.cache.kv.n
    chain = _decode_chain(engine, filler, start, before_decode=lambda: step(1))
    engine.costs.threads_agree = _threads_agree(engine, filler, start, chain, before_decode=lambda: step(0))

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
        if n > batch.capacity or start + n > min(len(filler), loaded.n_ctx):
            break
        if not np.array_equal(decode(n, drafts=True)[0], chain[0]):
            break
        rows = decode(n, drafts=False)
        if not all(np.array_equal(rows[k], chain[k]) for k in range(min(n, CHAIN_ROWS))):
            break
        best = n
    return best


def probe_threads_agree(engine: Measurable, cancel: threading.Event | None = None) -> bool:
    """Whether one thread gives the logits all of them give (``engine.costs.threads_agree``), alone: the part of the
    exact-batch probe the thread governor needs, at a fraction of its cost (a chunk of filler and ten decodes).
    Raises ``MeasurementCancelled`` between two decodes once ``cancel`` is set. Leaves the engine's cache empty.
    """
    def stop_if_cancelled() -> None:
        if cancel is not None and cancel.is_set():
            engine.cache.reset()
            raise MeasurementCancelled(None, "the thread probe was cancelled")

    filler = filler_tokens(engine)
    with engine.costs.all_threads():
        engine.cache.reset()
        engine.cache.prefill(filler[:PROBE_CHUNK])
        start = engine.cache.kv.n
        chain = _decode_chain(engine, filler, start, before_decode=stop_if_cancelled)
        agree = _threads_agree(engine, filler, start, chain, before_decode=stop_if_cancelled)
    engine.cache.reset()
    return agree


def _decode_chain(
    engine: Measurable, filler: list[int], start: int, before_decode: Callable[[], None]
) -> list[np.ndarray]:
    """Plain decoding's logits for the CHAIN_ROWS filler tokens after ``start``, one token at a time."""
    seqs = _all_seqs(engine)
    batch, ctx = engine.loaded.batch, engine.loaded.ctx
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
    if engine.loaded.n_threads < 2:
        return True
    batch, ctx = engine.loaded.batch, engine.loaded.ctx
    with engine.costs.all_threads():
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

