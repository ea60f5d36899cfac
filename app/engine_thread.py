"""The engine's thread: ``EngineThread`` starts one ``EngineWorker`` on its own ``QThread`` and stops it cleanly.

It wires the GUI's signals to the worker: queued to its thread for the work
itself, direct for what must reach it while it is busy (see ``WorkerControls``).
``LIVE_THREADS`` holds the threads the app starts; tests check none is left running.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal

from .worker import EngineWorker

log = logging.getLogger(__name__)

# Every engine thread the app starts; tests check none is left running.
LIVE_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()


class EngineThread(QObject):
    """Starts the worker's thread, wires the direct connections, and stops it cleanly.

    Signals:
        loadRequested(str, int, int): queued to ``EngineWorker.loadModel``.
        generateRequested(object): queued to ``EngineWorker.generate``.
        compareRequested(object): queued to ``EngineWorker.compare``.
        speedReportRequested(object): queued to ``EngineWorker.speedReport``.
        measureRequested(int): queued to ``EngineWorker.measureMachine``.
        stopRequested(): direct to ``EngineWorker.stop``.
        measureInterruptRequested(int): direct to ``EngineWorker.interruptMeasurement``.
        lookaheadChanged(object): direct to ``EngineWorker.setLookahead``.
        serveRequested(object): a local server's ``Job``, queued to ``EngineWorker.serveJob``; thread-safe (the
            server's thread emits it).
        readAheadRequested(object): a ``ReadAheadRequest`` (or None), direct to ``EngineWorker.wantReadAhead``,
            then queued to ``EngineWorker.readAhead``. Every request the user makes (not the idle-time
            measurement, which waits its turn) interrupts reading ahead and the thread probe.
    """

    loadRequested = Signal(str, int, int)
    generateRequested = Signal(object)
    compareRequested = Signal(object)
    speedReportRequested = Signal(object)
    measureRequested = Signal(int)
    rememberRequested = Signal(str, object)
    stopRequested = Signal()
    measureInterruptRequested = Signal(int)
    lookaheadChanged = Signal(object)
    readAheadRequested = Signal(object)
    serveRequested = Signal(object)
    _readAheadQueued = Signal()
    _shutdownRequested = Signal()

    def __init__(self, parent: QObject | None = None, **worker_options: Any) -> None:
        """``worker_options`` go to ``EngineWorker`` (its factories)."""
        super().__init__(parent)
        self.worker = EngineWorker(**worker_options)
        self.worker_thread = QThread()
        self.worker_thread.setObjectName("engine")
        self.worker.moveToThread(self.worker_thread)
        self.loadRequested.connect(self.worker.loadModel, Qt.ConnectionType.QueuedConnection)
        self.generateRequested.connect(self.worker.generate, Qt.ConnectionType.QueuedConnection)
        self.compareRequested.connect(self.worker.compare, Qt.ConnectionType.QueuedConnection)
        self.speedReportRequested.connect(self.worker.speedReport, Qt.ConnectionType.QueuedConnection)
        self.measureRequested.connect(self.worker.measureMachine, Qt.ConnectionType.QueuedConnection)
        self.rememberRequested.connect(self.worker.rememberChats, Qt.ConnectionType.QueuedConnection)
        self.serveRequested.connect(self.worker.serveJob, Qt.ConnectionType.QueuedConnection)
        self._shutdownRequested.connect(self.worker.shutdown, Qt.ConnectionType.QueuedConnection)
        # Direct: the worker's event loop is busy inside the generation or measurement these must reach.
        self.stopRequested.connect(self.worker.stop, Qt.ConnectionType.DirectConnection)
        self.measureInterruptRequested.connect(self.worker.interruptMeasurement, Qt.ConnectionType.DirectConnection)
        self.lookaheadChanged.connect(self.worker.setLookahead, Qt.ConnectionType.DirectConnection)
        self.readAheadRequested.connect(self.worker.wantReadAhead, Qt.ConnectionType.DirectConnection)
        self.readAheadRequested.connect(self._readAheadQueued)
        self._readAheadQueued.connect(self.worker.readAhead, Qt.ConnectionType.QueuedConnection)
        for asked in (self.loadRequested, self.generateRequested, self.compareRequested, self.speedReportRequested,
                      self.stopRequested, self.serveRequested):
            asked.connect(self.worker.interruptBackground, Qt.ConnectionType.DirectConnection)
        LIVE_THREADS.add(self.worker_thread)
        self.worker_thread.start()

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """Stop a running generation or load, free the engine, end the thread; True if it ended in time."""
        if not self.worker_thread.isRunning():
            return True
        self.worker.requestShutdown()
        self._shutdownRequested.emit()
        finished = self.worker_thread.wait(int(timeout_s * 1000))
        if not finished:
            log.error("the engine thread did not stop within %.1f s", timeout_s)
        return bool(finished)
