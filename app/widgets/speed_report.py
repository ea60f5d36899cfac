"""The speed report: benchmark prompts through the same comparison, as tables, exportable."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.speed.rows import PromptResult, by_category
from engine.speed.tables import (
    CATEGORY_HEADINGS,
    PROMPT_HEADINGS,
    category_cells,
    prompt_cells,
    report_csv,
    report_markdown,
    report_summary,
)
from engine.speed.workloads import Workload

from ..comparison_jobs import FAIRNESS_NOTE, SpeedReportOutcome, SpeedReportProgress
from . import plain
from .plain import Label
from .plain import tip as plain_tip

DEFAULT_MAX_TOKENS = 64


class SpeedReportDialog(QDialog):
    """Pick prompts (all, by category, or one by one), run them, read and export the tables.

    Signals:
        runRequested(list, int): run these ``Workload``s with this many tokens per reply.
        cancelRequested(): stop the running report (the rows so far are kept).
        rowAdded(object): a prompt's ``PromptResult`` was added to the table.
        reportEnded(object): the ``SpeedReportOutcome`` of the report that just ended.
    """

    runRequested = Signal(list, int)
    cancelRequested = Signal()
    rowAdded = Signal(object)
    reportEnded = Signal(object)

    def __init__(self, workloads: Sequence[Workload], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Speed report — Lookahead Chat")
        self.resize(1000, 640)
        self.workloads = list(workloads)
        self.results: list[PromptResult] = []
        self._request_id: int | None = None
        self._ready = False

        self.settings_label = Label()
        self.settings_label.setWordWrap(True)
        left, right = self._build_prompt_picker(), self._build_results()
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([240, 760])
        bottom = self._build_bottom_row()

        layout = QVBoxLayout(self)
        layout.addWidget(self.settings_label)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.status)
        layout.addLayout(bottom)
        self.tree.itemChanged.connect(self._on_selection_changed)
        self._show_count()
        self._update_buttons()

    def _build_prompt_picker(self) -> QWidget:
        """Which prompts: a tree of them by category, All and None, and the tokens per reply."""
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Prompts"])
        self._prompt_items: list[tuple[QTreeWidgetItem, Workload]] = []
        categories: dict[str, QTreeWidgetItem] = {}
        for w in self.workloads:
            parent_item = categories.get(w.cat)
            if parent_item is None:
                parent_item = QTreeWidgetItem(self.tree, [w.cat])
                parent_item.setFlags(
                    parent_item.flags() | Qt.ItemFlag.ItemIsAutoTristate | Qt.ItemFlag.ItemIsUserCheckable
                )
                categories[w.cat] = parent_item
            item = QTreeWidgetItem(parent_item, [w.id])
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(0, Qt.CheckState.Checked)
            item.setToolTip(0, plain_tip(w.prompt))
            self._prompt_items.append((item, w))
        self.tree.expandAll()
        self.all_button = QPushButton("All")
        self.all_button.clicked.connect(lambda: self.set_all_checked(True))
        self.none_button = QPushButton("None")
        self.none_button.clicked.connect(lambda: self.set_all_checked(False))
        self.max_tokens_spin = QSpinBox()
        self.max_tokens_spin.setRange(8, 2048)
        self.max_tokens_spin.setValue(DEFAULT_MAX_TOKENS)
        self.max_tokens_spin.setPrefix("max tokens ")
        self.max_tokens_spin.setToolTip("Longest reply per prompt and decoder")
        pick_buttons = QHBoxLayout()
        pick_buttons.addWidget(self.all_button)
        pick_buttons.addWidget(self.none_button)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.tree, 1)
        left_layout.addLayout(pick_buttons)
        left_layout.addWidget(self.max_tokens_spin)
        return left

    def _build_results(self) -> QWidget:
        """The tables, per prompt and per category, and the summary under them."""
        self.prompt_table = self._table(PROMPT_HEADINGS)
        speedup_header = QTableWidgetItem("speedup")
        speedup_header.setToolTip(
            "lookahead tok/s ÷ plain tok/s of each decoder's median run, with the range over the repeated pairs; "
            "claimed only where lookahead saved steps and every pair says the same side of 1.00×"
        )
        self.prompt_table.setHorizontalHeaderItem(PROMPT_HEADINGS.index("speedup"), speedup_header)
        predict_header = QTableWidgetItem("steps predict")
        predict_header.setToolTip("The gain lookahead's steps alone predict (tokens ÷ the steps' cost), machine aside")
        self.prompt_table.setHorizontalHeaderItem(PROMPT_HEADINGS.index("steps predict"), predict_header)
        self.category_table = self._table(CATEGORY_HEADINGS)
        self.category_table.setMaximumHeight(170)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(Label("Per prompt"))
        right_layout.addWidget(self.prompt_table, 1)
        right_layout.addWidget(Label("Per category"))
        right_layout.addWidget(self.category_table)
        self.summary = Label()  # report_summary: the measured and the predicted gain over every row
        self.summary.setWordWrap(True)
        right_layout.addWidget(self.summary)
        return right

    def _build_bottom_row(self) -> QHBoxLayout:
        """Progress, the status line (laid out above the row), Run, Cancel and the exports."""
        self.progress = QProgressBar()
        self.progress.setFormat("%v / %m prompts")
        self._total = len(self.workloads)  # prompts of the running or last report; before one, the selection
        self.status = Label()
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self._on_run_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.csv_button = QPushButton("Export CSV…")
        self.csv_button.clicked.connect(lambda: self._on_export_clicked("csv"))
        self.markdown_button = QPushButton("Export Markdown…")
        self.markdown_button.clicked.connect(lambda: self._on_export_clicked("md"))
        bottom = QHBoxLayout()
        bottom.addWidget(self.progress, 1)
        bottom.addWidget(self.run_button)
        bottom.addWidget(self.cancel_button)
        bottom.addWidget(self.csv_button)
        bottom.addWidget(self.markdown_button)
        return bottom

    @staticmethod
    def _table(columns: Sequence[str]) -> QTableWidget:
        table = QTableWidget(0, len(columns))
        table.setHorizontalHeaderLabels(list(columns))
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.verticalHeader().setVisible(False)
        table.verticalHeader().setDefaultSectionSize(table.fontMetrics().height() + 8)
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)  # the name column takes the slack
        return table

    # --- state ---

    def is_running(self) -> bool:
        return self._request_id is not None

    def set_ready(self, ready: bool) -> None:
        """Whether a report can start now (a model is loaded and the engine is free)."""
        self._ready = ready
        self._update_buttons()

    def set_settings_text(self, text: str) -> None:
        self.settings_label.setText(f"{FAIRNESS_NOTE} {text}")

    def selected_workloads(self) -> list[Workload]:
        return [w for item, w in self._prompt_items if item.checkState(0) == Qt.CheckState.Checked]

    def set_selected(self, ids: Sequence[str]) -> None:
        wanted = set(ids)
        for item, w in self._prompt_items:
            item.setCheckState(0, Qt.CheckState.Checked if w.id in wanted else Qt.CheckState.Unchecked)

    def set_all_checked(self, checked: bool) -> None:
        self.set_selected([w.id for w in self.workloads] if checked else [])

    def _show_count(self) -> None:
        """The counter: the rows listed, of the prompts planned (never more than that, never another count)."""
        self.progress.setRange(0, max(self._total, len(self.results)))
        self.progress.setValue(len(self.results))

    @Slot(QTreeWidgetItem, int)
    def _on_selection_changed(self, _item: QTreeWidgetItem, _column: int) -> None:
        if not self.is_running() and not self.results:
            self._total = len(self.selected_workloads())
            self._show_count()

    def _update_buttons(self) -> None:
        running = self.is_running()
        self.run_button.setEnabled(self._ready and not running)
        self.cancel_button.setEnabled(running)
        self.tree.setEnabled(not running)
        self.max_tokens_spin.setEnabled(not running)
        for button in (self.csv_button, self.markdown_button):
            button.setEnabled(bool(self.results))

    # --- the owner's calls ---

    def begin(self, request_id: int, total: int) -> None:
        """A report was sent to the worker."""
        self._request_id = request_id
        self.results = []
        self.prompt_table.setRowCount(0)
        self.category_table.setRowCount(0)
        self.summary.setText("")
        self._total = total
        self._show_count()
        self.status.setText(f"Running {total} prompt(s)…")
        self._update_buttons()

    @Slot(object)
    def on_progress(self, progress: SpeedReportProgress) -> None:
        if progress.request_id != self._request_id:
            return
        self.results.append(progress.result)
        r = progress.result
        row = self._append_row(self.prompt_table, prompt_cells(r), first_number=2)
        speedup_item = row[PROMPT_HEADINGS.index("speedup")]
        if r.verdict is not None and r.verdict.same_steps:
            speedup_item.setToolTip(
                f"Lookahead took the same steps as plain: the measured {r.speedup:.2f}× is the machine's, "
                "not lookahead's"
            )
        elif r.verdict is not None:
            speedup_item.setToolTip(f"measured {r.speedup:.2f}× over {r.verdict.pairs} pairs of runs")
        div = r.first_divergence
        if div:
            row[-1].setToolTip(
                f"first different token #{div['index']}: plain {div['plain_piece']!r} vs lookahead "
                f"{div['lookahead_piece']!r} (plain top-2 logit gap {div['plain_top2_gap']})"
            )
        self._fill_categories()
        self._show_count()
        self.status.setText(f"{len(self.results)} of {self._total} prompt(s) done…")
        self._update_buttons()
        self.rowAdded.emit(progress.result)

    @Slot(object)
    def on_finished(self, outcome: SpeedReportOutcome) -> None:
        if outcome.request_id != self._request_id:
            return
        self._request_id = None
        self._show_count()
        if outcome.error:
            self.status.setText(f"Failed after {len(self.results)} prompt(s): {outcome.error}")
        elif outcome.cancelled:
            self.status.setText(f"Cancelled after {len(self.results)} of {outcome.total} prompt(s).")
        else:
            self.status.setText(f"Done: {len(self.results)} prompt(s).")
        self.summary.setText(report_summary(self.results) if self.results else "")
        self._update_buttons()
        self.reportEnded.emit(outcome)

    @Slot()
    def cancel(self) -> None:
        if self.is_running():
            self.status.setText("Cancelling…")
            self.cancel_button.setEnabled(False)
            self.cancelRequested.emit()

    # --- tables and export ---

    @staticmethod
    def _append_row(table: QTableWidget, cells: list[str], first_number: int) -> list[QTableWidgetItem]:
        row = table.rowCount()
        table.insertRow(row)
        items = []
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if col >= first_number:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(row, col, item)
            items.append(item)
        return items

    def _fill_categories(self) -> None:
        self.category_table.setRowCount(0)
        for row in by_category(self.results):
            self._append_row(self.category_table, category_cells(row), first_number=1)
        self.summary.setText(report_summary(self.results))

    def table_text(self, table: QTableWidget) -> list[list[str]]:
        def text(r: int, c: int) -> str:
            item = table.item(r, c)
            return item.text() if item is not None else ""

        return [[text(r, c) for c in range(table.columnCount())] for r in range(table.rowCount())]

    def export(self, path: Path) -> None:
        """Write the results as Markdown (``.md``) or CSV (anything else)."""
        markdown = path.suffix.lower() in (".md", ".markdown")
        text = report_markdown(self.results) if markdown else report_csv(self.results)
        path.write_text(text, encoding="utf-8")

    @Slot()
    def _on_run_clicked(self) -> None:
        chosen = self.selected_workloads()
        if not chosen:
            self.status.setText("Tick at least one prompt.")
            return
        self.runRequested.emit(chosen, self.max_tokens_spin.value())

    def _on_export_clicked(self, kind: str) -> None:
        name, filt = ("speed-report.md", "Markdown (*.md)") if kind == "md" else ("speed-report.csv", "CSV (*.csv)")
        path, _ = QFileDialog.getSaveFileName(self, "Export speed report", str(Path.home() / name), filt)
        if not path:
            return
        try:
            self.export(Path(path))
        except OSError as exc:
            plain.export_failed(self, path, exc)
            return
        self.status.setText(f"Exported to {path}")

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt name)
        self.cancel()  # closing the report stops it; its rows so far stay for the next opening
        event.accept()
