"""What a forward pass costs on this machine, as a function of batch size.

On a CPU the extra tokens of a lookahead step are not free: a 2-token batch
can cost nearly twice a 1-token step. Every lookahead decision is priced with
this curve, measured for the loaded model and thread count in a few seconds
and cached per (model file, threads, CPU) in the user cache dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .contention import DecodeSample, RestProfile, waiting_share
from .files import cache_root, write_json_atomic

if TYPE_CHECKING:
    from .runtime import Engine

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


@dataclass(frozen=True)
class CostCurve:
    """Relative cost of a decode: ``cost(n, k)`` for n batch tokens of which k request logits.

    Costs are relative to a 1-token step with logits (= 1.0); ``base_ms`` is
    that step's time, for context only.
    """

    sizes: tuple[int, ...]
    last_logit: tuple[float, ...]  # cost(n, 1)
    all_logits: tuple[float, ...]  # cost(n, n)
    base_ms: float
    threads: int
    measured_s: float = 0.0
    # Largest batch whose logits are bit-identical to a 1-token step's (0 = none
    # tested exact). Bigger batches switch matmul kernels on some models and
    # CPUs, which changes near-tie argmaxes; steps are kept at or below it.
    max_exact_batch: int = 32
    # Whether decoding with fewer threads gives the same logits (probed with the batch sizes); the thread
    # governor only changes the thread count for a model where it does.
    threads_agree: bool = True
    # The same model's curve on one thread, measured with this one when the governor may use it: a step run on
    # fewer threads (another program holds a core) is priced on the curve of the threads it has (for_threads).
    one_thread: CostCurve | None = None
    # How this PC's decodes on every thread use their cores at rest (contention.RestProfile), learned while
    # this curve was timed: below it, decodes wait for cores another program holds.
    rest_floor: float | None = None
    # cost(n) with all logits and with one, for n < _TABLE: filled in by __post_init__.
    _every: list[float] = field(init=False, repr=False, compare=False)
    _one: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        every = [0.0] + [self._interp(n, n) for n in range(1, _TABLE)]
        one = [0.0] + [self._interp(n, 1) for n in range(1, _TABLE)]
        object.__setattr__(self, "_every", every)
        object.__setattr__(self, "_one", one)

    def cost(self, n: int, k: int | None = None) -> float:
        """Relative cost of a batch of ``n`` tokens with ``k`` logits (default: all)."""
        if 0 < n < _TABLE:
            if k is None or k >= n:
                return self._every[n]
            if n > 1:
                return self._one[n] + (self._every[n] - self._one[n]) * (max(k, 1) - 1) / (n - 1)
        return self._interp(n, k)

    def _interp(self, n: int, k: int | None = None) -> float:
        n = max(1, int(n))
        k = n if k is None else max(1, min(int(k), n))
        sizes = np.asarray(self.sizes, dtype=float)
        one = float(np.interp(n, sizes, self.last_logit))
        every = float(np.interp(n, sizes, self.all_logits))
        if n > self.sizes[-1]:  # extrapolate linearly from the last two points
            slope1 = (self.last_logit[-1] - self.last_logit[-2]) / (sizes[-1] - sizes[-2])
            slope2 = (self.all_logits[-1] - self.all_logits[-2]) / (sizes[-1] - sizes[-2])
            one = self.last_logit[-1] + slope1 * (n - sizes[-1])
            every = self.all_logits[-1] + slope2 * (n - sizes[-1])
        if n == 1:
            return every
        return one + (every - one) * (k - 1) / (n - 1)

    @property
    def rest(self) -> RestProfile:
        return RestProfile(self.rest_floor)

    def for_threads(self, threads: int) -> CostCurve:
        """The curve of ``threads`` threads: this one, the one-thread curve, or between the two in proportion to
        the thread count (counts between are not measured; live step times correct them as they run)."""
        one = self.one_thread
        if one is None or threads >= self.threads:
            return self
        if threads <= 1:
            return one
        w = (threads - 1) / (self.threads - 1)

        def mix(a: float, b: float) -> float:
            return round(a + (b - a) * w, 3)

        sizes = tuple(sorted(set(self.sizes) | set(one.sizes)))
        return replace(
            self,
            sizes=sizes,
            last_logit=tuple(mix(one.cost(n, 1), self.cost(n, 1)) for n in sizes),
            all_logits=tuple(mix(one.cost(n), self.cost(n)) for n in sizes),
            base_ms=mix(one.base_ms, self.base_ms),
            threads=threads,
            one_thread=None,
        )

    def table(self) -> str:
        rows = [f"{'batch':>5} {'1 logit':>8} {'all logits':>10}"]
        for n, a, b in zip(self.sizes, self.last_logit, self.all_logits, strict=False):
            rows.append(f"{n:>5} {a:>8.2f} {b:>10.2f}")
        rows.append(f"(1.00 = one token with logits = {self.base_ms:.2f} ms, {self.threads} threads)")
        return "\n".join(rows)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        out["one_thread"] = self.one_thread.to_json() if self.one_thread is not None else None
        return out

    @staticmethod
    def from_json(obj: dict) -> CostCurve:
        one = obj.get("one_thread")
        rest = obj.get("rest_floor")
        return CostCurve(
            sizes=tuple(obj["sizes"]),
            last_logit=tuple(obj["last_logit"]),
            all_logits=tuple(obj["all_logits"]),
            base_ms=float(obj["base_ms"]),
            threads=int(obj["threads"]),
            measured_s=float(obj.get("measured_s", 0.0)),
            max_exact_batch=int(obj.get("max_exact_batch", 32)),
            threads_agree=bool(obj.get("threads_agree", True)),
            one_thread=CostCurve.from_json(one) if isinstance(one, dict) else None,
            rest_floor=float(rest) if rest is not None else None,
        )


class LiveCosts:
    """The cost curve, corrected by the steps this engine has actually run.

    The curve is measured once and cached; the machine's load, its clock and
    the cache length of a long chat change what a batch really costs, and a
    lookahead step spends a little more time outside llama_decode than a
    plain one. Every step's wall time is recorded: 1-token steps give the
    current base, batches of n tokens (all with logits, as Auto's
    verification steps are) give ``time / base`` samples, and the median of
    the recent ones is blended with the curve's value, more so as samples
    accumulate. A 1-token step right after a batch is slower than the others
    (the compute graph changes shape back); what it takes beyond the base is
    charged to that batch, as the measured curve does.

    What the curve gets wrong here it mostly gets wrong alike for every size
    (a chat's cache deeper than the one the curve was timed at, a clock that
    changed since): every batch also teaches one shared scale of the curve's
    cost beyond a 1-token step, which prices the sizes seen rarely or not yet.
    """

    SAMPLES = 24  # recent batches kept per size
    PRIOR = 8.0  # the curve's value is worth this many samples
    SHARED_SAMPLES = 48  # recent batches of any size behind the shared scale
    SHARED_PRIOR = 6.0  # the curve as measured (scale 1) is worth this many of them
    MAX_SIZE = 32

    def __init__(self, curve: CostCurve, learn: bool = True) -> None:
        """``learn=False`` keeps the curve as given (a what-if curve for another machine)."""
        self.curve = curve
        self.learn = learn
        self._singles: deque[float] = deque(maxlen=64)
        self._ratios: dict[int, deque[float]] = {}
        self._cost: dict[int, float] = {}
        # _floor[n]: the dearest live cost of a size below n (n > MAX_SIZE: of any), so that a size not run
        # yet never looks cheaper than a smaller one that was (the measured curve may sit below live costs).
        self._floor = [0.0] * (self.MAX_SIZE + 2)
        self._after = 0  # batch size of the step just recorded (0: a 1-token step or none)
        self._medians: dict[int, float] = {}  # of _ratios, per size (only the size just recorded changes)
        self._excess: deque[float] = deque(maxlen=self.SHARED_SAMPLES)  # (seen - 1) / (curve - 1) per batch
        self._scale = 1.0

    def record(self, batch_size: int, n_logits: int, seconds: float) -> None:
        if seconds <= 0 or not self.learn:
            return
        after, self._after = self._after, 0
        if batch_size == 1:
            if after and self._singles:  # the batch before made this step slower: charge it there
                base = float(np.median(self._singles))
                ratios = self._ratios[after]
                ratios[-1] += max(seconds - base, 0.0) / base
                self._add_excess(after, ratios[-1], replace_last=True)
                self._update(after)
            else:
                self._singles.append(seconds)
            return
        if n_logits != batch_size or batch_size > self.MAX_SIZE or len(self._singles) < 8:
            return
        base = float(np.median(self._singles))
        ratio = seconds / base
        self._ratios.setdefault(batch_size, deque(maxlen=self.SAMPLES)).append(ratio)
        self._add_excess(batch_size, ratio)
        self._after = batch_size
        self._update(batch_size)

    def _add_excess(self, batch_size: int, ratio: float, replace_last: bool = False) -> None:
        if replace_last and self._excess:
            self._excess.pop()
        self._excess.append((ratio - 1.0) / max(self.curve.cost(batch_size) - 1.0, 0.05))

    def _scaled(self, curve_cost: float) -> float:
        """The curve's cost with its part beyond a 1-token step scaled as the batches seen say."""
        return 1.0 + (curve_cost - 1.0) * self._scale

    def _update(self, batch_size: int) -> None:
        """``batch_size`` has a new or changed sample: its median, the shared scale and every size's cost follow."""
        self._medians[batch_size] = float(np.median(self._ratios[batch_size]))
        w = len(self._excess) / (len(self._excess) + self.SHARED_PRIOR)
        self._scale = max((1 - w) + w * float(np.median(self._excess)), 0.0)
        for n, median in self._medians.items():
            w = len(self._ratios[n]) / (len(self._ratios[n]) + self.PRIOR)
            self._cost[n] = max((1 - w) * self._scaled(self.curve.cost(n)) + w * median, 1.0)
        dearest = 0.0
        for n in range(1, len(self._floor)):
            self._floor[n] = dearest
            dearest = max(dearest, self._cost.get(n, 0.0))

    def cost(self, n: int, k: int | None = None) -> float:
        if (k is None or k >= n) and n in self._cost:
            return self._cost[n]
        return max(self._scaled(self.curve.cost(n, k)), self._floor[min(max(n, 0), len(self._floor) - 1)])

    def scale(self) -> float:
        """The shared scale of the curve's cost beyond a 1-token step (1.0: as measured)."""
        return self._scale

    def observed(self) -> dict[int, tuple[float, int]]:
        """Batch size -> (cost in use, samples behind it), for sizes seen while generating."""
        return {n: (round(c, 3), len(self._ratios[n])) for n, c in sorted(self._cost.items())}


# A curve to plan with before (or instead of) measuring: the shape measured on
# 2-core x86 machines with a 135M Q4_1 model.
DEFAULT_CURVE = CostCurve(
    sizes=(1, 2, 3, 4, 6, 8, 16, 32, 64),
    last_logit=(1.0, 1.75, 2.4, 3.0, 4.0, 4.8, 7.8, 15.0, 29.0),
    all_logits=(1.0, 1.95, 2.7, 3.4, 4.5, 5.6, 9.0, 16.0, 31.0),
    base_ms=12.0,
    threads=2,
)


# Reference curves: plan as if on a CPU where batches are dear, or nearly free. ``LOOKAHEAD_COST_CURVE``
# (a name here or a curve file) makes an engine plan with one instead of measuring this machine, so that
# what Auto does can be checked as it would run on either kind of machine (the test suite runs under both).
REFERENCE_CURVES = {
    # The bundled model on a 2-core AMD EPYC (AVX-512, VNNI), all logits c(2) 2.08, c(4) 3.05, c(8) 5.03
    # as measured by engine tune; the sizes between and beyond follow that curve's slope.
    "steep": CostCurve(
        sizes=(1, 2, 3, 4, 6, 8, 16, 32, 64),
        last_logit=(1.0, 1.95, 2.45, 2.85, 3.8, 4.7, 8.4, 16.0, 31.0),
        all_logits=(1.0, 2.08, 2.6, 3.05, 4.05, 5.03, 9.0, 17.0, 33.0),
        base_ms=9.6,
        threads=2,
    ),
    # A machine whose small batches cost little more than a step: Auto drafts whenever it has a draft.
    "flat": CostCurve(
        sizes=(1, 2, 3, 4, 6, 8, 16, 32, 64),
        last_logit=(1.0, 1.03, 1.06, 1.1, 1.2, 1.3, 1.7, 2.7, 4.9),
        all_logits=(1.0, 1.05, 1.1, 1.15, 1.25, 1.35, 1.75, 2.8, 5.0),
        base_ms=9.6,
        threads=2,
    ),
}
COST_CURVE_ENV = "LOOKAHEAD_COST_CURVE"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(model_path: str, threads: int) -> str:
    from .native import build_id  # local: keeps this module importable without llama.cpp

    st = os.stat(model_path)
    ident = (f"v{CACHE_VERSION}|{os.path.abspath(model_path)}|{st.st_size}|{int(st.st_mtime)}|{threads}"
             f"|{cpu_name()}|{os.cpu_count()}|{build_id()}")
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    return cache_root() / "costs"


def load_cached(model_path: str, threads: int) -> CostCurve | None:
    path = cache_dir() / f"{cache_key(model_path, threads)}.json"
    try:
        return CostCurve.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_cached(model_path: str, threads: int, curve: CostCurve) -> Path:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{cache_key(model_path, threads)}.json"
    write_json_atomic(path, curve.to_json())
    return path


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
    engine: Engine,
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
    engine: Engine,
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
                # A batch also slows the 1-token step after it (the compute graph changes shape back):
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
    engine: Engine,
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


def _read_prefix(engine: Engine, prefix: list[int], step: _ProbeSteps) -> None:
    """Empty the cache, then read ``prefix`` in PROBE_CHUNK pieces, so that a cancel is never far off."""
    engine.reset()
    for i in range(0, len(prefix), PROBE_CHUNK):
        step(1)
        engine.prefill(prefix[i : i + PROBE_CHUNK], progress=lambda _done, _total: step(0))  # a cancel: per chunk


def _probe_chain(
    engine: Engine, filler: list[int], progress: Callable[[float], None] | None, sizes: tuple[int, ...]
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


def _probe_sizes(
    engine: Engine, filler: list[int], progress: Callable[[float], None] | None, sizes: tuple[int, ...]
) -> int:
    from .plan import ALL_SEQS

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
    chain: list[np.ndarray] = []  # plain decoding of the tokens after the prefix, one at a time
    for k in range(CHAIN_ROWS):
        step(1)
        batch.set_single_seq(filler[start + k : start + k + 1], start + k, ALL_SEQS, last_logits=True)
        ctx.decode(batch)
        chain.append(ctx.logits_rows(1)[0].copy())
    engine.threads_agree = _threads_agree(engine, filler, start, chain, before_decode=lambda: step(0))

    def decode(n: int, drafts: bool) -> np.ndarray:
        step(n / PROBE_CHUNK)  # also where a measurement's cancel takes effect: between two decodes
        ctx.seq_rm(-1, start, -1)
        batch.set_single_seq(filler[start : start + n], start, ALL_SEQS, last_logits=False)
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


def _threads_agree(
    engine: Engine, filler: list[int], start: int, chain: list[np.ndarray], before_decode: Callable[[], None]
) -> bool:
    """Whether one thread gives the logits ``chain`` holds (decoded with all of them), for a lone token past
    the probe's depth and for a batch of the chain's tokens."""
    from .plan import ALL_SEQS

    if engine.n_threads < 2:
        return True
    batch, ctx = engine.batch, engine.ctx
    with engine.all_threads():
        ctx.set_threads(1)
        try:
            for n in (1, CHAIN_ROWS):
                before_decode()
                ctx.seq_rm(-1, start, -1)
                batch.set_single_seq(filler[start : start + n], start, ALL_SEQS, last_logits=False)
                batch.logits[:n] = 1
                ctx.decode(batch)
                rows = ctx.logits_rows(n)
                if not all(np.array_equal(rows[k], chain[k]) for k in range(n)):
                    return False
        finally:
            ctx.seq_rm(-1, start, -1)
    return True


def curve_for(
    engine: Engine,
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
