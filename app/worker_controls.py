"""What reaches the engine's worker while it is busy, and the thread-safe state that carries it.

Some requests must reach the worker *while* it is inside a generation loop (or
a measurement, or a read ahead), when its event loop cannot run queued slots:
stop and a new lookahead shape above all. Those slots are here, connected with
``Qt.DirectConnection`` by ``EngineThread``; they run on the caller's thread and
only touch thread-safe state (an Event, a value under a lock) that the worker
reads between two steps. ``EngineWorker`` (app/worker.py) is built on this class.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Slot

from engine import GenerationControls, LookaheadConfig
from engine.server import Job

from .requests import ReadAheadRequest


class WorkerControls(QObject):
    """The engine worker's state shared between threads, and the slots other threads call directly."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._controls: GenerationControls | None = None
        self._pending_lookahead: tuple[LookaheadConfig | None] | None = None  # 1-tuple: None is a valid value
        self._shutting_down = threading.Event()
        self._job_cancel: threading.Event | None = None  # the running comparison's or speed report's
        self._measuring: tuple[int, threading.Event] | None = None  # the running measurement's id and cancel
        self._measure_cancelled_upto = 0  # measurements with this id or a lower one are not wanted any more
        # What the next prompt will begin with (the chat in view, the files attached so far): read into the cache
        # when the worker has nothing else to do, and again after a job that emptied it (wantReadAhead).
        self._read_ahead: ReadAheadRequest | None = None
        # Set when the user asks for anything: stop background work (reading ahead; the thread probe). A new
        # read-ahead stops an older one, not the probe.
        self._read_ahead_cancel = threading.Event()
        self._probe_cancel = threading.Event()
        self._serving: Job | None = None  # the local server's request running now

    def _apply_pending_lookahead(self, controls: GenerationControls) -> LookaheadConfig | None:
        """On the worker's thread, before a step: the lookahead ``setLookahead`` asked for, from this step on."""
        with self._lock:
            if self._pending_lookahead is not None:
                controls.lookahead = self._pending_lookahead[0]
                self._pending_lookahead = None
            return controls.lookahead

    # --- slots connected directly: run on the caller's thread, touch only thread-safe state ---

    @Slot(int)
    def interruptMeasurement(self, upto_id: int) -> None:
        """Stop measurements with ids up to ``upto_id``, running or still queued, between two decodes."""
        with self._lock:
            self._measure_cancelled_upto = max(self._measure_cancelled_upto, upto_id)
            if self._measuring is not None and self._measuring[0] <= upto_id:
                self._measuring[1].set()

    @Slot(object)
    def wantReadAhead(self, request: ReadAheadRequest | None) -> None:
        """From now on the next prompt begins with ``request``'s chat and files (None: nothing known): a read of an
        older one stops after its chunk; ``readAhead`` (queued) reads this one."""
        with self._lock:
            self._read_ahead = request
            self._read_ahead_cancel.set()
            self._read_ahead_cancel = threading.Event()  # the queued readAhead's

    @Slot()
    def interruptBackground(self) -> None:
        """Stop reading ahead or probing after the current decode: the user asked for something."""
        with self._lock:
            self._read_ahead_cancel.set()
            self._probe_cancel.set()

    @Slot()
    def stop(self) -> None:
        """Ask the running generation (or comparison, or speed report) to stop before its next step."""
        with self._lock:
            if self._controls is not None:
                self._controls.cancel.set()
            if self._job_cancel is not None:
                self._job_cancel.set()

    @Slot(object)
    def setLookahead(self, config: LookaheadConfig | None) -> None:
        """Use ``config`` (None = plain decoding) from the running generation's next step on."""
        if config is not None:
            config.validate()
        with self._lock:
            if self._controls is not None:
                self._pending_lookahead = (config,)

    def requestShutdown(self) -> None:
        """Thread-safe: abort a running load and the running generation (a chat's or the local server's)."""
        self._shutting_down.set()
        with self._lock:
            if self._serving is not None:
                self._serving.cancel.set()
        self.interruptMeasurement(2**62)
        self.interruptBackground()
        self.stop()
