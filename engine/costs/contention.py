"""Threads for llama.cpp on a PC that other programs use too.

ggml splits every graph node among its threads and makes them meet at a barrier
after it, about a thousand times per token. When another program takes one of
the cores, the thread that shares it waits for its next time slice at every
barrier, and a 2-thread decode can run slower than a 1-thread one. Step times
alone cannot say why a step is slow (a long chat makes attention dearer too);
the process's CPU time can: during a decode every llama.cpp thread either
computes or spins at a barrier, so CPU time is wall time × threads unless a
thread was waiting for a core.

How far below 1.0 that share falls on a quiet PC is the PC's own: a VM whose
host takes its vCPUs now and then, a worker thread that wakes late. It is
learned while the cost curve is measured (``RestProfile``, kept with the curve),
and a window of decodes counts as busy only when it falls well below that.

``ThreadGovernor`` then does not guess which thread count is best, it tries: a
busy window starts a trial of one thread fewer, kept only if its decodes are
faster (on some CPUs one thread alone is slower than two sharing a core). While
reduced it tries one thread more once the OS says a core is free again
(``CpuLoad``: other programs' use of this process's CPUs), or now and then when
the OS cannot tell. Decodes are compared by their time per 1-token step of the
thread count they ran with (``DecodeSample.cost``, priced on that count's curve),
so a trial that happened to run bigger batches is not taken for a slower one.

Changing the thread count does not change any result: each output of a node is
computed by one thread whatever their number (checked per model by the
exact-batch probe, see exactness.probe_exact_batch; the governor is off for a
model where it would not be).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import psutil

# Decodes waited for cores when their threads had them for less than this share of their wall time. Used alone
# only where this PC's rest is not known yet: to stop a measurement that another program disturbs
# (calibration.measure), and as the bar before the first measurement. It sits between a quiet PC's share (near 1)
# and what two threads get with one core of two taken (docs/SPEED.md, "The figures behind the code's constants").
BUSY_UTILIZATION = 0.8
# Shorter decodes are never judged: a worker thread waking up late is most of their time (a tiny model's
# decodes take well under a millisecond), and a model that fast loses little to a busy core anyway.
MIN_JUDGED_S = 0.003
# Judged decodes behind each busy/not busy judgment: their CPU time over their wall time × threads. One decode
# alone says little: the OS credits a running thread's CPU time at its timer ticks (every 1-10 ms), so a short
# decode's share reads well above or below its true value on a quiet PC; over 8 decodes that evens out.
WINDOW = 8
# Long decodes (a prompt read in chunks) fill a window sooner: this much decode time is as good as WINDOW decodes.
WINDOW_S = 0.25
PROBE_DECODES = 5  # decodes run on trial (the first is not compared: the thread pool changes size), or fewer
# that take WINDOW_S
FASTER = 0.95  # a trial's thread count is kept when its decodes take at most this share of the time
RETRY_S = 3.0  # first wait before trying again after a change or a failed trial; doubled after each failure
MAX_RETRY_S = 30.0
# Cores' worth of CPU time other programs (and a VM's host, as steal) must take beyond what this process's
# threads leave free of its CPUs for a thread fewer to be tried (far above what an idle PC's daemons take); and
# what must be left free beside its threads for one more.
TAKEN = 0.25
FREE = 0.5


def busy_notice(threads: int, max_threads: int) -> str:
    """What the user is told while decodes run on ``threads`` of ``max_threads`` because a core is busy."""
    return f"Another program is busy: using {threads} of {max_threads} cores"


@dataclass(frozen=True)
class DecodeSample:
    """One llama_decode: its wall and process CPU seconds, the threads it ran with and its expected cost."""

    wall: float
    cpu: float
    threads: int
    # What the decode costs in 1-token steps of ``threads`` threads (that count's cost curve): wall / cost is
    # the time of a 1-token step as the PC runs now, comparable between thread counts and batch sizes.
    cost: float

    @property
    def utilization(self) -> float:
        """Share of wall time × threads the process spent on a CPU (1.0: no thread waited for a core)."""
        return self.cpu / (self.wall * self.threads) if self.wall > 0 else 1.0

    @property
    def judged(self) -> bool:
        return self.wall >= MIN_JUDGED_S

    @property
    def per_cost(self) -> float:
        return self.wall / max(self.cost, 1e-9)


@dataclass(frozen=True)
class RestProfile:
    """How decodes on every thread use their cores on this PC when nothing else runs.

    ``floor``: the lowest share of ``WINDOW`` consecutive 1-token decodes seen at
    rest (its 1st percentile); None until learned. A window counts as busy below
    ``busy_below``: a margin under that floor, never above ``BUSY_UTILIZATION``
    (which what two threads get with one core of two taken stays under) and never
    so low that a busy core could not be seen at all.
    """

    floor: float | None = None

    MARGIN = 0.1
    LOWEST = 0.55

    @property
    def busy_below(self) -> float:
        if self.floor is None:
            return BUSY_UTILIZATION
        return min(max(self.floor - self.MARGIN, self.LOWEST), BUSY_UTILIZATION)

    @staticmethod
    def learn(samples: Sequence[DecodeSample]) -> RestProfile:
        """The profile of consecutive decodes timed at rest (the judged ones count); unlearned if too few."""
        judged = [s for s in samples if s.judged]
        if len(judged) < 4 * WINDOW:
            return RestProfile()
        shares = [share(judged[i : i + WINDOW]) for i in range(len(judged) - WINDOW + 1)]
        return RestProfile(round(float(np.percentile(shares, 1)), 3))


def waiting_share(samples: Sequence[DecodeSample]) -> float:
    """The share of windows of WINDOW consecutive decodes whose threads had less than BUSY_UTILIZATION of their
    cores: how much of a run another program shaped, where this PC's rest is not known. A window too short to
    judge (a tiny model's decodes) counts as not waiting."""
    windows = [samples[i : i + WINDOW] for i in range(len(samples) - WINDOW + 1)]
    waited = sum(sum(s.wall for s in w) >= WINDOW * MIN_JUDGED_S and share(w) < BUSY_UTILIZATION for w in windows)
    return waited / len(windows) if windows else 0.0


def _enough(samples: Sequence[DecodeSample], count: int) -> bool:
    """Whether ``samples`` say enough to judge by: ``count`` of them, or at least two taking WINDOW_S."""
    return len(samples) >= count or (len(samples) >= 2 and sum(s.wall for s in samples) >= WINDOW_S)


def share(samples: Sequence[DecodeSample]) -> float:
    """The share of their cores that decodes' threads had, together (1.0: none waited)."""
    wall = sum(s.wall * s.threads for s in samples)
    return sum(s.cpu for s in samples) / wall if wall > 0 else 1.0


class CpuLoad:
    """What other programs take of the CPUs this process may use, from the OS's per-CPU times (psutil).

    ``others()`` is the CPUs' worth of time they used (a VM host's steal
    included) over the last fraction of a second: all busy time on those CPUs
    less this process's own. None when it cannot be told: a cgroup quota smaller
    than the CPUs (the throttling is not in these counters), or no fresh reading.
    """

    MIN_SPAN_S = 0.25  # readings at most this often
    MAX_SPAN_S = 2.0  # a span longer than this (the app idle between replies) says nothing about now

    def __init__(
        self,
        cpus: Sequence[int] | None,
        read: Callable[[], Sequence[float]] | None = None,
        own: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``cpus``: the CPUs' indexes (None: unknown, ``others`` is always None); ``read``: their busy seconds."""
        self.cpus = tuple(cpus) if cpus else ()
        self._read = read or (lambda: _busy_seconds(self.cpus))
        self._own = own
        self._clock = clock
        self._at: tuple[float, float, float] | None = None  # (clock, all busy seconds, own seconds)
        self._value: float | None = None

    @property
    def capacity(self) -> int:
        return len(self.cpus)

    @staticmethod
    def for_this_process() -> CpuLoad:
        from engine.costs.cpus import cpu_report  # local: cpus reads /sys, only needed here

        try:
            cpus = sorted(psutil.Process().cpu_affinity() or [])
        except (AttributeError, OSError, psutil.Error):  # macOS has no affinity: every CPU
            cpus = list(range(os.cpu_count() or 1))
        quota = cpu_report().quota
        if quota is not None and math.floor(quota) < len(cpus):
            return CpuLoad(None)
        return CpuLoad(cpus)

    def others(self) -> float | None:
        if not self.cpus:
            return None
        now = self._clock()
        at = self._at
        if at is not None and now - at[0] < self.MIN_SPAN_S:
            return self._value
        try:
            busy, own = float(sum(self._read())), self._own()
        except (OSError, psutil.Error, IndexError):
            self._at, self._value = None, None
            return None
        self._at = (now, busy, own)
        if at is None or now - at[0] > self.MAX_SPAN_S:
            self._value = None
        else:
            self._value = max(0.0, ((busy - at[1]) - (own - at[2])) / (now - at[0]))
        return self._value


def _busy_seconds(cpus: Sequence[int]) -> list[float]:
    """Each CPU's busy seconds since boot: everything but idle and I/O wait (guest time is in user already)."""
    times = psutil.cpu_times(percpu=True)
    out = []
    for i in cpus:
        t = times[i]._asdict()
        spent = sum(t.values()) - t.get("idle", 0.0) - t.get("iowait", 0.0)
        out.append(spent - t.get("guest", 0.0) - t.get("guest_nice", 0.0))
    return out


class ThreadGovernor:
    """The thread count llama.cpp decodes with: all of ``max_threads`` unless that is slower beside other programs.

    ``observe`` hears every decode; it returns the thread count for the next one
    (the caller applies it: llama_set_n_threads). ``threads`` is the count kept;
    ``trying`` a count on trial. ``busy`` says whether the last window of decodes
    waited for cores, judged against ``rest``. ``steady`` is True while decodes
    run as that count's cost curve was measured (no trial, not busy): only such
    steps may teach Auto's live costs.
    """

    # Set by reset(): the state a governor starts from.
    threads: int
    trying: int | None
    busy: bool
    last: DecodeSample | None
    _recent: deque[DecodeSample]  # judged decodes at the count running now
    _trial: list[DecodeSample]
    _busy_run: int  # judged decodes in a row after which the window was busy
    _wait: dict[int, float]  # per direction: the wait after a failed trial
    _next: dict[int, float]  # per direction: when a trial may start

    def __init__(
        self,
        max_threads: int,
        adapt: bool = True,
        clock: Callable[[], float] = time.monotonic,
        rest: RestProfile | None = None,
        load: CpuLoad | None = None,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.adapt = adapt
        self.rest = rest or RestProfile()
        self.load = load or CpuLoad(None)
        self._clock = clock
        self.reductions = 0  # thread counts given up and kept (for reports)
        self.trials = 0
        self._others: float | None = None  # the OS's count at the last decode (CpuLoad.others)
        self._baseline = 0.0
        self.reset()

    @property
    def running(self) -> int:
        """The thread count decodes run with now."""
        return self.trying if self.trying is not None else self.threads

    @property
    def steady(self) -> bool:
        last = self.last
        return self.trying is None and not self.busy and (last is None or last.threads == self.threads)

    @property
    def reduced(self) -> bool:
        """True while fewer threads than the maximum are kept because that was faster beside other programs."""
        return self.threads < self.max_threads

    def notice(self) -> str:
        """A sentence for the user while threads are reduced ("" otherwise)."""
        return busy_notice(self.threads, self.max_threads) if self.reduced else ""

    def observe(self, sample: DecodeSample) -> int:
        """Record one decode; returns the thread count for the next one."""
        self.last = sample
        self._others = self.load.others()  # read from the OS a few times a second, whatever happens next
        if sample.threads != self.running:
            return self.running  # ran before the last change took effect
        if sample.judged:
            self._recent.append(sample)
            self.busy = self._judge()
            self._busy_run = self._busy_run + 1 if self.busy else 0
        if not self.adapt:
            return self.running
        if self.trying is not None:
            return self._judge_trial(sample)
        if not self._window_full():
            return self.threads
        now = self._clock()
        # Fewer threads for waiting the OS puts down to other programs at once; where it cannot tell, only for
        # waiting that lasts (a window of busy windows): at rest a late wake-up or a VM's host can make one window
        # look busy now and then, another program holding a core makes them all so.
        lasting = self._busy_run >= (1 if self._others is not None else WINDOW)
        if self.busy and lasting and self.threads > 1 and now >= self._next[-1] and self._others_allow(-1):
            self._start_trial(-1)
        elif self.threads < self.max_threads and now >= self._next[1] and self._others_allow(1):
            self._start_trial(1)
        return self.running

    def _judge(self) -> bool:
        """Whether the last window of decodes waited for cores (not judged before it is full)."""
        return self._window_full() and share(self._recent) < self.rest.busy_below

    def _window_full(self) -> bool:
        return _enough(self._recent, WINDOW)

    def _others_allow(self, direction: int) -> bool:
        """Whether the OS's counts leave room for a thread fewer (-1) or more (+1); unknown counts allow both."""
        others = self._others
        if others is None:
            return True
        spare = self.load.capacity - self.threads - others  # CPUs' worth left idle beside our threads
        return spare <= -TAKEN if direction < 0 else spare >= FREE

    def _start_trial(self, direction: int) -> None:
        self._baseline = float(np.median([s.per_cost for s in self._recent]))
        self.trying = self.threads + direction
        self.trials += 1
        self._trial = []
        self._recent.clear()
        self._busy_run = 0

    def _judge_trial(self, sample: DecodeSample) -> int:
        self._trial.append(sample)
        if not _enough(self._trial[1:], PROBE_DECODES - 1):
            return self.running
        assert self.trying is not None
        direction = 1 if self.trying > self.threads else -1
        faster = float(np.median([s.per_cost for s in self._trial[1:]])) <= FASTER * self._baseline
        now = self._clock()
        if faster:
            self.threads = self.trying
            self.reductions += direction < 0
            self._wait = {-1: RETRY_S, 1: RETRY_S}
            self._next = {-1: now + RETRY_S, 1: now + RETRY_S}  # the other way not at once: let the load settle
            self._recent = deque(self._trial[1:], maxlen=WINDOW)
        else:
            self._next[direction] = now + self._wait[direction]
            self._wait[direction] = min(self._wait[direction] * 2, MAX_RETRY_S)
            self._recent.clear()
        self.trying = None
        self._trial = []
        self.busy = self._judge()
        self._busy_run = 0
        return self.threads

    def reset(self) -> None:
        """Start again from all threads (a new model, the user's own thread count, a measurement's end)."""
        self.threads = self.max_threads
        self.trying = None
        self.busy = False
        self.last = None
        self._recent = deque(maxlen=WINDOW)
        self._trial = []
        self._busy_run = 0
        self._wait = {-1: RETRY_S, 1: RETRY_S}
        self._next = {-1: 0.0, 1: 0.0}
