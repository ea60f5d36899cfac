"""Routing comparisons and speed reports: from the Compare tab and the report dialog to the worker and back.

The jobs the worker runs for them are app/comparison_jobs.py.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QWidget

from engine import LookaheadConfig
from engine.decoding.text import conversation_messages
from engine.speed.workloads import Workload, load_workloads

from ..comparison_jobs import CompareRequest, CompareResult, SpeedReportOutcome, SpeedReportProgress, SpeedReportRequest
from ..engine_thread import EngineThread
from . import plain
from .compare_view import CompareView, lookahead_title
from .decoding_panel import DecodingPanel
from .speed_report import SpeedReportDialog


class Comparisons(QObject):
    """Starts comparisons and speed reports with the decoding panel's settings and routes their answers.

    ``ready()`` says whether a model is loaded and the engine is free; ``next_id()``
    gives request ids (shared with the chat's).

    Signals:
        busyChanged(): a comparison or a speed report started or ended.
        started(): the engine is about to work for one (a measurement at idle must pause).
        finished(): it is over (done, stopped or failed).
        stopRequested(): Stop or Cancel in the tab or the dialog.
    """

    busyChanged = Signal()
    started = Signal()
    finished = Signal()
    stopRequested = Signal()

    def __init__(
        self,
        view: CompareView,
        panel: DecodingPanel,
        engine: EngineThread,
        ready: Callable[[], bool],
        lookahead_block_reason: Callable[[], str | None],
        next_id: Callable[[], int],
        parent_widget: QWidget,
    ) -> None:
        super().__init__(parent_widget)
        self.view = view
        self._panel = panel
        self._engine = engine
        self._ready = ready
        self._block_reason = lookahead_block_reason
        self._next_id = next_id
        self._parent = parent_widget
        self._plain_first = True  # flips after every comparison
        self.report_dialog: SpeedReportDialog | None = None
        self._report_request_id: int | None = None
        self.closed = False
        view.compareRequested.connect(self.start_comparison)
        view.stopRequested.connect(self.stopRequested)
        view.speedReportRequested.connect(self.open_speed_report)
        view.busyChanged.connect(self.busyChanged)
        w = engine.worker
        w.compareProgress.connect(view.on_progress)
        w.compareFinished.connect(self._on_compare_finished)
        w.compareFailed.connect(self._on_compare_failed)
        w.reportProgress.connect(self._on_report_progress)
        w.reportFinished.connect(self._on_report_finished)

    def is_comparing(self) -> bool:
        return self.view.is_measuring()

    def is_reporting(self) -> bool:
        return self._report_request_id is not None

    def lookahead_config(self) -> LookaheadConfig:
        """The decoding panel's Auto or W/N/G, used even while lookahead is switched off for the chat."""
        return self._panel.chosen_lookahead()

    def set_ready(self, ready: bool) -> None:
        self.view.set_ready(ready)
        if self.report_dialog is not None:
            self.report_dialog.set_ready(ready)

    def _refuse(self, parent: QWidget) -> bool:
        """True (after saying why) when no comparison can run now."""
        reason = self._block_reason()
        if reason:
            plain.show_message(parent, plain.Icon.Information, "Nothing to compare", reason)
            return True
        return False

    @Slot(str)
    def start_comparison(self, text: str) -> bool:
        """Run ``text`` through plain and lookahead decoding (one after the other) and replay them."""
        text = text.strip()
        if not text or not self._ready() or self._refuse(self._parent):
            return False
        request = CompareRequest(
            request_id=self._next_id(),
            messages=tuple(conversation_messages(self._panel.system_prompt(), user_text=text)),
            lookahead=self.lookahead_config(),
            sampling=self._panel.sampling_config(),
            stop=self._panel.stop_config(),
            plain_first=self._plain_first,
        )
        self._plain_first = not self._plain_first
        self.started.emit()
        self.view.begin(request)  # emits busyChanged
        self._engine.compareRequested.emit(request)
        return True

    @Slot(object)
    def _on_compare_finished(self, result: CompareResult) -> None:
        if not self.closed:  # a result that arrives while closing has no one left to watch it
            self.view.on_finished(result)
            self.finished.emit()

    @Slot(int, str)
    def _on_compare_failed(self, request_id: int, message: str) -> None:
        self.view.on_failed(request_id, message)
        self.finished.emit()
        if not self.closed:
            plain.show_message(self._parent, plain.Icon.Warning, "Could not compare", message)

    @Slot()
    def open_speed_report(self) -> SpeedReportDialog | None:
        """Show the speed report dialog (created on first use, kept with its results)."""
        if self.report_dialog is None:
            try:
                workloads = load_workloads()
            except (OSError, ValueError) as exc:
                plain.show_message(self._parent, plain.Icon.Critical, "No benchmark prompts", str(exc))
                return None
            self.report_dialog = SpeedReportDialog(workloads, self._parent)
            self.report_dialog.runRequested.connect(self.start_speed_report)
            self.report_dialog.cancelRequested.connect(self.stopRequested)
        self.report_dialog.set_settings_text(self._settings_text())
        self.busyChanged.emit()
        self.report_dialog.show()
        self.report_dialog.raise_()
        return self.report_dialog

    def _settings_text(self) -> str:
        sampling = self._panel.sampling_config().describe(self._panel.stop_config().loop_guard)
        return f"{lookahead_title(self.lookahead_config())} (from the decoding panel), with this chat's system " \
               f"prompt and settings: {sampling}."

    @Slot(list, int)
    def start_speed_report(self, workloads: list[Workload], max_tokens: int) -> None:
        dialog = self.report_dialog
        if dialog is None or not workloads or not self._ready() or self._refuse(dialog):
            return
        request = SpeedReportRequest(
            request_id=self._next_id(),
            workloads=tuple(workloads),
            lookahead=self.lookahead_config(),
            system_prompt=self._panel.system_prompt(),
            sampling=self._panel.sampling_config(),
            max_tokens=max_tokens,
            loop_guard=self._panel.stop_config().loop_guard,
        )
        self._report_request_id = request.request_id
        dialog.set_settings_text(self._settings_text())
        dialog.begin(request.request_id, len(workloads))
        self.started.emit()
        self.busyChanged.emit()
        self._engine.speedReportRequested.emit(request)

    @Slot(object)
    def _on_report_progress(self, progress: SpeedReportProgress) -> None:
        if self.report_dialog is not None:
            self.report_dialog.on_progress(progress)

    @Slot(object)
    def _on_report_finished(self, outcome: SpeedReportOutcome) -> None:
        if outcome.request_id != self._report_request_id:
            return
        self._report_request_id = None
        if self.report_dialog is not None:
            self.report_dialog.on_finished(outcome)
        self.busyChanged.emit()
        self.finished.emit()

    def shutdown(self) -> None:
        self.closed = True
        self.view.shutdown()
        if self.report_dialog is not None:
            self.report_dialog.close()
