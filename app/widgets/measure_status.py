"""Timing this PC for lookahead while the app is idle, shown in the status bar (progress, time left, Skip).

Lookahead guesses several tokens and checks them in one batch; whether a batch of a given size pays off
depends on how this PC's CPU handles it. The worker times batches once per model (``measureMachine``);
until then Auto plans with a cautious default curve.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QTimer, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QWidget

from ..engine_thread import EngineThread
from .plain import Label
from .plain import tip as plain_tip

RESUME_AFTER_MS = 2000  # quiet time after a reply before an interrupted measurement starts again
RETRY_BUSY_MS = 60_000  # after another program took the CPU from a measurement: try again this much later
RESULT_SHOW_MS = 15_000  # how long the result stays in the status bar (long enough to read it)
TICK_MS = 500  # how often the time left is updated between two progress reports
ESTIMATE_S = 20.0  # what a measurement takes on a quiet PC, before its own progress says better
SETTLED_FRACTION = 0.03  # below this share done, the time left comes from ESTIMATE_S, not the rate so far

PURPOSE = (
    "Lookahead guesses a few words ahead and checks the guesses in one batch. Whether that pays off "
    "depends on how fast this PC runs batches of each size, so the app times them once per model "
    "(about {seconds} on a quiet PC). Chat works meanwhile: sending a message pauses the timing."
)
SKIP_COST = (
    "Skip: lookahead uses a cautious default and may be slower on this PC.\n"
    "You can measure later with “Measure now”, here in the status bar."
)
RUNNING_TEXT = "Timing this PC for lookahead"
SKIPPED_TEXT = "Lookahead not timed for this PC"
SKIPPED_TIP = (
    "Lookahead plans with a cautious default, which may be slower on this PC than a measured one.\n"
    "“Measure now” times this PC (it runs while the app is idle; chat works meanwhile)."
)
RESULT_TIP = (
    "How much a batch of guessed tokens costs on this PC, in single steps: lookahead only guesses as far as "
    "it pays off. Kept for this model and this PC; nothing to do."
)


def format_left(seconds: float) -> str:
    """The time left, as people say it: "about 12 s left", "about 2 min left", "a few seconds left"."""
    if seconds <= 3:
        return "a few seconds left"
    if seconds < 90:
        return f"about {round(seconds):d} s left"
    return f"about {round(seconds / 60):d} min left"


def time_left(elapsed_s: float, fraction: float, estimate_s: float = ESTIMATE_S) -> float:
    """Seconds still to go: from the rate so far once it means something, else from the usual duration."""
    if fraction >= SETTLED_FRACTION and elapsed_s > 0:
        return max(0.0, elapsed_s / fraction - elapsed_s)
    return max(estimate_s - elapsed_s, estimate_s * (1 - fraction) / 2)


class MeasureStatus(QWidget):
    """Runs the worker's cost measurement at idle times and shows what it is for, its progress and time left.

    States: "idle" (not started), "running", "paused" (the engine was wanted for a reply, or the PC
    was busy: resumes later), "done" (measured, known from before, or failed), "skipped".
    Visible while running (progress, time left, Skip), for ``RESULT_SHOW_MS`` after a measurement
    (its result), and after Skip or a failure (with "Measure now", to measure later).

    Signals:
        message(str): a sentence for the status bar (skipped, failed, the PC was busy).
    """

    message = Signal(str)

    def __init__(self, engine: EngineThread, can_run: Callable[[], bool], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._engine = engine
        self._can_run = can_run
        self._id = 0
        self.state = "idle"
        self.fraction = 0.0
        self.face = ""  # what the widget shows: "running", "result", "measure" (with Measure now), "" = hidden
        self._started_at = 0.0
        self.label = Label()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(120)
        self.progress.setTextVisible(False)
        self.skip_button = QPushButton("Skip")
        self.skip_button.setToolTip(SKIP_COST)
        self.skip_button.clicked.connect(self.skip)
        self.measure_button = QPushButton("Measure now")
        self.measure_button.setToolTip("Time this PC for lookahead now (chat works meanwhile)")
        self.measure_button.clicked.connect(self.measure_now)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 0, 0, 0)  # apart from the status bar's message on its left
        for widget in (self.label, self.progress, self.skip_button, self.measure_button):
            row.addWidget(widget)
        self.setVisible(False)
        self._resume = QTimer(self)
        self._resume.setSingleShot(True)
        self._resume.setInterval(RESUME_AFTER_MS)
        self._resume.timeout.connect(self.start)
        self._tick = QTimer(self)  # the time left moves on between two progress reports
        self._tick.setInterval(TICK_MS)
        self._tick.timeout.connect(self._show_time_left)
        self._hide_result = QTimer(self)
        self._hide_result.setSingleShot(True)
        self._hide_result.timeout.connect(self._on_result_read)
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
        self._hide()

    @Slot()
    def start(self) -> None:
        """Measure now, unless it is known, skipped, or the engine has other work."""
        if self.state in ("running", "done", "skipped") or not self._can_run():
            return
        self._id += 1
        self.state = "running"
        self.fraction = 0.0
        self._started_at = time.monotonic()
        self.progress.setValue(0)
        self._hide_result.stop()
        self._engine.measureRequested.emit(self._id)

    @Slot()
    def measure_now(self) -> None:
        """Measure again after Skip or a failure (when idle: it waits for a reply under way to end)."""
        if self.state == "running":
            return
        self._busy_until = 0.0
        self.state = "idle"
        self._show("Waiting for the app to be idle to time this PC…", SKIPPED_TIP, face="waiting")
        self.start()
        if self.state != "running":
            self.resume_later()

    def interrupt(self) -> None:
        """The engine is wanted for something else: pause (it resumes when idle, see ``resume_later``)."""
        self._resume.stop()
        if self.state == "running":
            self.state = "paused"
            self._engine.measureInterruptRequested.emit(self._id)
            self._hide()

    def make_way(self) -> None:
        """Other work the user will want soon (reading an attached file ahead) goes first: pause, and go on once
        it is done (the worker takes requests in order; the cache survives a measurement)."""
        if self.state == "running":
            self.interrupt()
            self.resume_later()

    def resume_later(self) -> None:
        if self.state in ("idle", "paused") and not self._resume.isActive():
            wait_ms = int((self._busy_until - time.monotonic()) * 1000)
            self._resume.start(max(RESUME_AFTER_MS, wait_ms))

    @Slot()
    def skip(self) -> None:
        """Leave Auto on its cautious default curve for this model, until "Measure now" is pressed."""
        self.interrupt()
        self.state = "skipped"
        self._show(SKIPPED_TEXT, SKIPPED_TIP, face="measure")
        self.message.emit(
            "Timing skipped: lookahead uses a cautious default and may be slower on this PC "
            "(“Measure now” in the status bar times it later)"
        )

    def _show(self, text: str, tip: str, face: str) -> None:
        """One of the widget's faces: "running" (progress and Skip), "measure" (a sentence and "Measure now"),
        or another sentence alone ("result", "waiting")."""
        self.face = face
        self.label.setText(text)
        self.label.setToolTip(plain_tip(tip))
        self.setToolTip(plain_tip(tip))
        self.progress.setVisible(face == "running")
        self.skip_button.setVisible(face == "running")
        self.measure_button.setVisible(face == "measure")
        self._hide_result.stop()
        if face == "running":
            self._tick.start()
        else:
            self._tick.stop()
        self.setVisible(True)

    def _hide(self) -> None:
        self.face = ""
        self._tick.stop()
        self._hide_result.stop()
        self.setVisible(False)

    def _running_text(self) -> str:
        left = time_left(time.monotonic() - self._started_at, self.fraction)
        return f"{RUNNING_TEXT}: {format_left(left)}"  # what it is for, and that chat works meanwhile: the tooltip

    @Slot()
    def _show_time_left(self) -> None:
        if self.state == "running":
            self.label.setText(self._running_text())

    @Slot(float)
    def _on_progress(self, fraction: float) -> None:
        if self.state != "running":
            return
        self.fraction = max(self.fraction, fraction)
        if self.face != "running":  # only once it really runs: a known curve needs no progress
            about = format_left(ESTIMATE_S).removesuffix(" left")
            self._show(self._running_text(), f"{PURPOSE.format(seconds=about)}\n\n{SKIP_COST}", face="running")
        self.progress.setValue(int(self.fraction * 1000))
        self.label.setText(self._running_text())

    @Slot()
    def _on_result_read(self) -> None:
        if self.state == "done" and self.face == "result":
            self._hide()

    @Slot(int, str, str)
    def _on_finished(self, request_id: int, state: str, text: str) -> None:
        if request_id != self._id:
            return  # an earlier measurement (another model's, or one paused before this started)
        self._tick.stop()
        if state == "cancelled":
            if self.state == "running":  # stopped by no one here (the engine shutting down): retry when idle
                self.state = "paused"
                self._hide()
            return
        if state == "busy":  # times taken under load are not this PC's: try again in a while
            if self.state == "running":
                self.state = "paused"
                self._busy_until = time.monotonic() + RETRY_BUSY_MS / 1000
                self._resume.start(RETRY_BUSY_MS)
            self._hide()
            self.message.emit(text)
            return
        if self.state == "skipped":
            return
        self.state = "done"
        if state == "measured":
            self._show(text or "Measured this PC for lookahead", RESULT_TIP, face="result")
            self._hide_result.start(RESULT_SHOW_MS)
        elif state == "failed":
            self._show("Lookahead not timed: the measurement failed", f"{text}\n\n{SKIPPED_TIP}", face="measure")
            self.message.emit(f"Timing this PC failed: {text}")
        else:  # known from before, or not needed (no lookahead for this model): nothing to show
            self._hide()
