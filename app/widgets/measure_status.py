"""Measuring this PC for Auto while the app is idle, shown in the status bar ("Measuring this PC…", Skip)."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QTimer, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from ..worker import EngineThread

RESUME_AFTER_MS = 2000  # quiet time after a reply before an interrupted measurement starts again
RETRY_BUSY_MS = 60_000  # after another program took the CPU from a measurement: try again this much later


class MeasureStatus(QWidget):
    """Runs the worker's cost measurement at idle times and shows its progress; hidden otherwise.

    States: "idle" (not started), "running", "paused" (the engine was wanted for a
    reply: resumes once idle), "done" (measured, known from before, or failed), "skipped".

    Signals:
        message(str): a sentence for the status bar (measured, skipped, failed).
    """

    message = Signal(str)

    def __init__(self, engine: EngineThread, can_run: Callable[[], bool], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._engine = engine
        self._can_run = can_run
        self._id = 0
        self.state = "idle"
        self.label = QLabel("Measuring this PC for lookahead…")
        self.label.setToolTip(
            "Auto times batches of every size once per model, to know which drafts pay on this PC.\n"
            "Until then it plans with a cautious default. Sending a message pauses the measurement."
        )
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(120)
        self.progress.setTextVisible(False)
        self.skip_button = QPushButton("Skip")
        self.skip_button.setToolTip("Skip the measurement this session (Auto keeps its cautious default)")
        self.skip_button.clicked.connect(self.skip)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label)
        row.addWidget(self.progress)
        row.addWidget(self.skip_button)
        self.setVisible(False)
        self._resume = QTimer(self)
        self._resume.setSingleShot(True)
        self._resume.setInterval(RESUME_AFTER_MS)
        self._resume.timeout.connect(self.start)
        self._busy_until = 0.0  # monotonic time before which a measurement stopped by a busy PC is not retried
        engine.worker.measureProgress.connect(self._on_progress)
        engine.worker.measureFinished.connect(self._on_finished)

    def is_running(self) -> bool:
        return self.state == "running"

    def new_model(self) -> None:
        """A model is being loaded: whatever was measured was for the other one."""
        self.interrupt()
        self._id += 1  # answers about the other model's measurement are ignored from now on
        self.state = "idle"

    @Slot()
    def start(self) -> None:
        """Measure now, unless it is known, skipped, or the engine has other work."""
        if self.state in ("running", "done", "skipped") or not self._can_run():
            return
        self._id += 1
        self.state = "running"
        self.progress.setValue(0)
        self._engine.measureRequested.emit(self._id)

    def interrupt(self) -> None:
        """The engine is wanted for something else: pause (it resumes when idle, see ``resume_later``)."""
        self._resume.stop()
        if self.state == "running":
            self.state = "paused"
            self._engine.measureInterruptRequested.emit(self._id)
            self.setVisible(False)

    def resume_later(self) -> None:
        if self.state in ("idle", "paused") and not self._resume.isActive():
            wait_ms = int((self._busy_until - time.monotonic()) * 1000)
            self._resume.start(max(RESUME_AFTER_MS, wait_ms))

    @Slot()
    def skip(self) -> None:
        """Leave Auto on its cautious default curve for this model, this session."""
        self.interrupt()
        self.state = "skipped"
        self.message.emit("Measurement skipped: Auto plans with a cautious default until next start")

    @Slot(float)
    def _on_progress(self, fraction: float) -> None:
        if self.state == "running":
            self.setVisible(True)  # only once it really runs: a known curve needs no progress
            self.progress.setValue(int(fraction * 1000))

    @Slot(int, str, str)
    def _on_finished(self, request_id: int, state: str, text: str) -> None:
        if request_id != self._id:
            return  # an earlier measurement (another model's, or one paused before this started)
        self.setVisible(False)
        if state == "cancelled":
            if self.state == "running":  # stopped by no one here (the engine shutting down): retry when idle
                self.state = "paused"
            return
        if state == "busy":  # times taken under load are not this PC's: try again in a while
            if self.state == "running":
                self.state = "paused"
                self._busy_until = time.monotonic() + RETRY_BUSY_MS / 1000
                self._resume.start(RETRY_BUSY_MS)
            self.message.emit(text)
            return
        if self.state != "skipped":
            self.state = "done"
        if text:
            self.message.emit(text)
