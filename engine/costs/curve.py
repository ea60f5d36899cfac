"""What a forward pass costs on this machine, as a function of batch size.

On a CPU the extra tokens of a lookahead step are not free: a 2-token batch
can cost nearly twice a 1-token step. Every lookahead decision is priced with
this curve, measured for the loaded model and thread count in a few seconds
(``engine.costs.calibration``) and cached per (model file, threads, CPU) in the
user cache dir. Nothing here drives llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from engine.costs.contention import RestProfile
from engine.files import cache_root, file_identity, write_json_atomic

_TABLE = 300
CACHE_VERSION = 10


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
    current base, batches of n tokens give ``time / base`` samples, and the
    median of the recent ones is blended with the curve's value, more so as
    samples accumulate. A batch whose rows a grammar gives without logits counts
    as the same rows with all of them, the curve's price of the logits it left
    out added (and such a batch is priced back the same way): under a schema most
    drafting steps are of that kind, and they are the ones that show where the
    measured curve is off for the sizes Auto plans with. A 1-token step right
    after a batch can be slower than the others (where llama.cpp builds its
    compute graph again: after a batch of more than 8 tokens, patch part 11
    keeping one for each smaller size); what it takes beyond the base is
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
    MIN_SINGLES = 8  # recent 1-token steps before their median is the base a step's time is read against

    def __init__(self, curve: CostCurve, learn: bool = True) -> None:
        """``learn=False`` keeps the curve as given (a what-if curve for another machine)."""
        self.curve = curve
        self.learn = learn
        self._singles: deque[float] = deque(maxlen=64)
        self._single_median: float | None = None  # of _singles, until the next one comes
        self._ratios: dict[int, deque[float]] = {}
        self._cost: dict[int, float] = {}
        # _floor[n]: the dearest live cost of a size below n (n > MAX_SIZE: of any), so that a size not run
        # yet never looks cheaper than a smaller one that was (the measured curve may sit below live costs).
        self._floor = [0.0] * (self.MAX_SIZE + 2)
        self._after = 0  # batch size of the step just recorded (0: a 1-token step or none)
        self._medians: dict[int, float] = {}  # of _ratios, per size (only the size just recorded changes)
        self._excess: deque[float] = deque(maxlen=self.SHARED_SAMPLES)  # (seen - 1) / (curve - 1) per batch
        self._scale = 1.0
        self.version = 0  # counts the changes of what ``cost`` answers

    def record(self, batch_size: int, n_logits: int, seconds: float) -> None:
        if seconds <= 0 or not self.learn:
            return
        after, self._after = self._after, 0
        if batch_size == 1 and n_logits == 0:  # a token the grammar gave put into the cache: no step's price
            return
        if batch_size == 1:
            if after and self._singles:  # the batch before made this step slower: charge it there
                base = self._single_s()
                ratios = self._ratios[after]
                ratios[-1] += max(seconds - base, 0.0) / base
                self._add_excess(after, ratios[-1], replace_last=True)
                self._update(after)
            else:
                self._singles.append(seconds)
                self._single_median = None
            return
        if batch_size > self.MAX_SIZE or len(self._singles) < self.MIN_SINGLES:
            return
        base = self._single_s()
        ratio = seconds / base + self._left_out(batch_size, n_logits)
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
        self.version += 1
        self._medians[batch_size] = statistics.median(self._ratios[batch_size])
        w = len(self._excess) / (len(self._excess) + self.SHARED_PRIOR)
        self._scale = max((1 - w) + w * statistics.median(self._excess), 0.0)
        for n, median in self._medians.items():
            w = len(self._ratios[n]) / (len(self._ratios[n]) + self.PRIOR)
            self._cost[n] = max((1 - w) * self._scaled(self.curve.cost(n)) + w * median, 1.0)
        dearest = 0.0
        for n in range(1, len(self._floor)):
            self._floor[n] = dearest
            dearest = max(dearest, self._cost.get(n, 0.0))

    def cost(self, n: int, k: int | None = None) -> float:
        if n in self._cost:
            if k is None or k >= n:
                return self._cost[n]
            return max(self._cost[n] - self._left_out(n, k), 1.0)
        return max(self._scaled(self.curve.cost(n, k)), self._floor[min(max(n, 0), len(self._floor) - 1)])

    def _left_out(self, n: int, k: int) -> float:
        """The curve's price of the logits a batch of ``n`` rows with ``k`` of them leaves out."""
        return self.curve.cost(n) - self.curve.cost(n, k) if k < n else 0.0

    def in_steps(self, seconds: float, batch_size: int, n_logits: int) -> float:
        """A step that took ``seconds`` in 1-token steps: over the recent 1-token steps' median time, or, before
        there are enough of those, the price of its batch."""
        if len(self._singles) < self.MIN_SINGLES:
            return self.cost(batch_size, n_logits)
        return seconds / self._single_s()

    def _single_s(self) -> float:
        """The recent 1-token steps' median wall time (statistics.median: a fifth of np.median's time on so few),
        worked out once for the steps that read it (a run of drafting steps reads it twice each)."""
        if self._single_median is None:
            self._single_median = statistics.median(self._singles)
        return self._single_median

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
    # The bundled model on a 2-core AMD EPYC (AVX-512, VNNI): c(2), c(4), c(8) with all logits as engine tune
    # measured them; the sizes between and beyond follow that curve's slope.
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
    from engine.llama.backend import build_id  # local: keeps this module importable without llama.cpp

    ident = f"v{CACHE_VERSION}|{file_identity(model_path)}|{threads}|{cpu_name()}|{os.cpu_count()}|{build_id()}"
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
