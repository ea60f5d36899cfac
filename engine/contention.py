"""Threads for llama.cpp on a PC that other programs use too.

ggml splits every graph node among its threads and makes them meet at a barrier
after it, about a thousand times per token. When another program takes one of
the cores, the thread that shares it waits for its next time slice at every
barrier, and a 2-thread decode runs slower than a 1-thread one. Step times
alone cannot say why a step is slow (a long chat makes attention dearer too);
the process's CPU time can: during a decode every llama.cpp thread either
computes or spins at a barrier, so CPU time is wall time × threads unless a
thread was waiting for a core. ``ThreadGovernor`` watches that share over the
last few decodes, drops a thread when it stays low, tries one more again later
and keeps it only if decodes got faster.

Changing the thread count does not change any result: each output of a node is
computed by one thread whatever their number (checked per model by the
exact-batch probe, see costmodel.probe_exact_batch; the governor is off for a
model where it would).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# A decode ran contended when its threads had their cores for less than this share of its wall time.
# Measured on 2 cores, bundled model: idle, the median is 1.00 and 1% of decodes fall to 0.85 (a worker that
# slept between steps wakes late); with one core busy, 2 threads get ~0.75 (0.53..0.78).
BUSY_UTILIZATION = 0.8
# Shorter decodes are never judged contended: a worker thread waking up late is most of their time (a tiny
# model's decodes take well under a millisecond), and a model that fast loses little to a busy core anyway.
MIN_JUDGED_S = 0.003
WINDOW = 6  # decodes looked at before dropping a thread
DROP_AFTER = 4  # contended decodes among the last WINDOW that drop a thread
PROBE_DECODES = 5  # decodes tried with one thread more (the first is not judged: the pool wakes up)
RETRY_S = 3.0  # first wait before trying one thread more; doubled after each failed try
MAX_RETRY_S = 30.0
FASTER = 0.95  # one thread more is kept when its decodes take at most this share of the time


def busy_notice(threads: int, max_threads: int) -> str:
    """What the user is told while decodes run on ``threads`` of ``max_threads`` because a core is busy."""
    return f"Another program is busy: using {threads} of {max_threads} cores"


@dataclass(frozen=True)
class DecodeSample:
    """One llama_decode: its wall and process CPU seconds, the threads it ran with and its expected cost."""

    wall: float
    cpu: float
    threads: int
    cost: float  # what the cost curve says it costs, in 1-token steps (normalises times of different batches)

    @property
    def utilization(self) -> float:
        """Share of wall time × threads the process spent on a CPU (1.0: no thread waited for a core)."""
        return self.cpu / (self.wall * self.threads) if self.wall > 0 else 1.0

    @property
    def contended(self) -> bool:
        return self.wall >= MIN_JUDGED_S and self.utilization < BUSY_UTILIZATION

    @property
    def per_cost(self) -> float:
        return self.wall / max(self.cost, 1e-9)


class ThreadGovernor:
    """The thread count llama.cpp decodes with: all of ``max_threads`` unless other programs hold cores.

    ``observe`` hears every decode; it returns the thread count to use from the
    next decode on (the caller applies it: llama_set_n_threads). ``steady`` is
    True while decodes run as the cost curve was measured (all threads, no
    contention, no trial): only such steps may teach Auto's live costs.
    """

    def __init__(self, max_threads: int, adapt: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_threads = max(1, max_threads)
        self.threads = self.max_threads
        self.adapt = adapt
        self._clock = clock
        self._recent: deque[DecodeSample] = deque(maxlen=WINDOW)
        self._trial: list[DecodeSample] | None = None  # decodes with one thread more, on trial
        self._baseline = 0.0  # time per cost unit before the trial
        self._retry_s = RETRY_S
        self._next_try = 0.0
        self.last: DecodeSample | None = None
        self.reductions = 0  # how many times a thread was dropped (for reports)

    @property
    def steady(self) -> bool:
        last = self.last
        return (
            self.threads == self.max_threads
            and self._trial is None
            and (last is None or (not last.contended and last.threads == self.max_threads))
        )

    @property
    def reduced(self) -> bool:
        """True while fewer threads than the maximum run because cores were busy."""
        return self.threads < self.max_threads and self._trial is None

    def notice(self) -> str:
        """A sentence for the user while threads are reduced ("" otherwise)."""
        return busy_notice(self.threads, self.max_threads) if self.reduced else ""

    def observe(self, sample: DecodeSample) -> int:
        """Record one decode; returns the thread count for the next one."""
        self.last = sample
        if not self.adapt:
            return self.threads
        if self._trial is not None:
            return self._judge_trial(sample)
        if sample.threads != self.threads:
            return self.threads  # ran before the last change took effect
        self._recent.append(sample)
        now = self._clock()
        if self.threads > 1 and sum(s.contended for s in self._recent) >= DROP_AFTER:
            self.threads -= 1
            self.reductions += 1
            self._recent.clear()
            self._retry_s = RETRY_S
            self._next_try = now + self._retry_s
        elif self.threads < self.max_threads and now >= self._next_try and len(self._recent) == WINDOW:
            self._baseline = float(np.median([s.per_cost for s in self._recent]))
            self._trial = []
            return self.threads + 1
        return self.threads

    def _judge_trial(self, sample: DecodeSample) -> int:
        trial = self._trial
        assert trial is not None
        trial.append(sample)
        if len(trial) < PROBE_DECODES:
            return self.threads + 1
        judged = trial[1:]
        self._trial = None
        self._recent.clear()
        # Faster is what counts: a PC whose cores are all shared (a VM's host, say) may run faster with
        # every thread even though they wait.
        if float(np.median([s.per_cost for s in judged])) <= FASTER * self._baseline:
            self.threads += 1
            self._retry_s = RETRY_S
        else:
            self._retry_s = min(self._retry_s * 2, MAX_RETRY_S)
        self._next_try = self._clock() + self._retry_s
        return self.threads

    def reset(self) -> None:
        """Start again from all threads (a new model, or the user's own thread count)."""
        self.threads = self.max_threads
        self._recent.clear()
        self._trial = None
        self._retry_s = RETRY_S
        self._next_try = 0.0
        self.last = None
