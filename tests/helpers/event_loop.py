"""Whether the GUI thread's event loop kept running during a test: a 10 ms QTimer and the gaps between its ticks.

Two clocks are read at every tick. The GUI thread's own CPU time measures the work the window did between two
ticks (Markdown, layout, a file read or a decode that should have been on another thread); other programs on
the machine do not add to it, so its bound stays strict. The wall clock also counts the time the thread waited
(for a lock, for another thread) and the time a loaded machine did not run it at all: the scheduler gave the
core to another program, or Python collected garbage, each now and then a single pause. So on the wall clock a
run passes with at most ``PAUSES_ALLOWED`` pauses a user would notice and none that lasts ``STALL_MS``.

While it watches, the objects that were alive when it started are frozen out of the garbage collector
(``gc.freeze``): a test session's heap (every module the tests import, the windows before this one) is many times
the app's, and a full collection of it on the GUI thread would be counted as the window's work. What the window
allocates while watched is collected as usual.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

from PySide6.QtCore import QTimer

TICK_MS = 10  # the ticker's interval
PAUSE_MS = 250  # a pause a user notices
PAUSES_ALLOWED = 2  # what a loaded CI machine's scheduler or a garbage collection causes in a few seconds
STALL_MS = 1000  # the GUI thread held, whatever the machine: waiting for other work, or doing it


def _gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


class EventLoopWatch:
    """Ticks every ``TICK_MS`` on the GUI thread while started, noting the wall clock and that thread's CPU time."""

    def __init__(self) -> None:
        self.wall_ms: list[float] = []
        self.cpu_ms: list[float] = []
        self._timer = QTimer()
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()
        gc.unfreeze()

    def _tick(self) -> None:
        self.wall_ms.append(time.perf_counter() * 1000)
        self.cpu_ms.append(time.thread_time() * 1000)  # this runs on the GUI thread: its CPU time

    def assert_kept_running(self) -> None:
        """No work of a noticeable length between two ticks, and only the odd pause of a loaded machine."""
        wall, cpu = _gaps(self.wall_ms), _gaps(self.cpu_ms)
        assert len(wall) > 5, f"the ticker fired {len(self.wall_ms)} times"
        assert max(cpu) < PAUSE_MS, f"the GUI thread worked {max(cpu):.0f} ms between two ticks"
        pauses = sorted(round(g) for g in wall if g >= PAUSE_MS)
        assert len(pauses) <= PAUSES_ALLOWED and max(wall) < STALL_MS, (
            f"the event loop stood still for {pauses} ms ({len(wall)} ticks; allowed: {PAUSES_ALLOWED} pauses of "
            f"{PAUSE_MS} ms or more, none of {STALL_MS} ms)"
        )
