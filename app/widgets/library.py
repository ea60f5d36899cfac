"""Model → Library…: the GGUF models already on disk in other apps' folders, with their facts, to load.

The scan (``engine.library.walk.scan``) runs on a thread of its own, never the engine's: the chat and
the window stay responsive, and closing the dialog cancels it between two files.
"""

from __future__ import annotations

import os
import threading
import time

from PySide6.QtCore import QModelIndex, QSortFilterProxyModel, Qt, QThread, Signal, Slot
from PySide6.QtGui import QCloseEvent, QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QListWidget,
    QMessageBox,
    QPushButton,
    QStyle,
    QTableView,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.library.folders import KIND_FILE, LibraryRoot, library_roots
from engine.library.names import DRAFTS_ONLY_NOTE, LookaheadKind, lookahead_cell
from engine.library.walk import HeaderCache, LibraryModel, ScanResult, SearchedFolder, scan
from engine.llama.problems import LoadProblem
from engine.units import format_params, plain_size

from ..engine_thread import LIVE_THREADS
from . import model_info
from .plain import Label
from .plain import tip as plain_tip

COLUMNS = (
    "Name", "Architecture", "Parameters", "Quantisation", "Size", "Trained context", "Chat template", "Lookahead",
    "Found in", "File",
)
SORT_ROLE = Qt.ItemDataRole.UserRole + 1  # numbers sort as numbers, not as text
MODEL_ROLE = Qt.ItemDataRole.UserRole + 2  # the row's LibraryModel, on its first cell
PROGRESS_INTERVAL_S = 0.1  # at most ten "Scanning… N files" updates a second
LOADED_MARK = "● loaded"  # after the name of the model in use
SEARCHED_COLUMNS = ("Folder", "App", "Found")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same file (a symlink, a relative path, or a blob reached two ways)."""
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def searched_state(folder: SearchedFolder) -> str:
    """What a searched folder gave, in a few words: "3 models", "no models", "not on this PC"."""
    if not folder.exists:
        return "not on this PC"
    if folder.kind == KIND_FILE:
        return "the model that comes with the app" if folder.models else "not a usable model"
    if folder.models == 0:
        return "no models"
    return "1 model" if folder.models == 1 else f"{folder.models} models"


class ScanThread(QThread):
    """One scan of the library on its own thread; ``cancel()`` stops it before the next file.

    Signals:
        progressed(int, str): files looked at so far, and the one now.
        found(object): the ``ScanResult`` (also of a cancelled scan).
        failed(str): the scan raised; the message.
    """

    progressed = Signal(int, str)
    found = Signal(object)
    failed = Signal(str)

    def __init__(self, roots: list[LibraryRoot], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("library-scan")
        self.roots = roots
        self._cancel = threading.Event()
        self._last_progress = 0.0
        LIVE_THREADS.add(self)

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        try:
            result = scan(self.roots, self._cancel, self._on_progress, HeaderCache())
        except Exception as exc:  # a bug must reach the dialog, not end the thread silently
            self.failed.emit(f"{type(exc).__name__}: {exc}")
            return
        self.found.emit(result)

    def _on_progress(self, files: int, path: str) -> None:
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_INTERVAL_S:
            self._last_progress = now
            self.progressed.emit(files, path)


def _cell(text: str, sort_key: object = None, tip: str = "") -> QStandardItem:
    item = QStandardItem(text)
    item.setEditable(False)
    item.setData(sort_key if sort_key is not None else text.casefold(), SORT_ROLE)
    if tip:
        item.setToolTip(plain_tip(tip))
    return item


def _row(model: LibraryModel) -> list[QStandardItem]:
    """A model's cells; a broken file says why on hover, a model without lookahead says why not."""
    if model.ok:
        trained = model.context_length
        kind = model.lookahead_kind
        lookahead_tip = model.lookahead_block_reason or (
            DRAFTS_ONLY_NOTE if kind == LookaheadKind.DRAFTS_ONLY else "Lookahead decoding works with this model")
        cells = [
            _cell(model.name, tip=model.path),
            _cell(model.architecture),
            _cell(format_params(model.n_params) if model.n_params else "", model.n_params),
            _cell(model.file_type),
            _cell(plain_size(model.size_bytes), model.size_bytes),
            _cell(f"{trained:,}" if trained else "", trained or 0),
            _cell("yes" if model.has_chat_template else "no"),
            _cell(lookahead_cell(kind), tip=lookahead_tip),
        ]
    else:
        error = "\n\n".join(t for t in (model.problem, model.error) if t) or "unknown"
        cells = [_cell(model.name, tip=error), _cell("broken file", tip=error), _cell("", 0), _cell(""),
                 _cell(plain_size(model.size_bytes), model.size_bytes), _cell("", 0), _cell(""),
                 _cell("no", tip="The file cannot be loaded")]
    cells += [_cell(model.source), _cell(model.path, tip=model.path)]
    cells[0].setData(model, MODEL_ROLE)
    return cells


class LibraryDialog(QDialog):
    """The model library: a sortable, filterable table of what the scan found, and what it skipped.

    Double-click (or Load) asks for a good model and closes; a broken file shows why instead. The model in
    use (``loaded_path``) is marked "● loaded" in bold and selected; the "Searched" tab lists every folder
    looked in, whether it is on this PC, and how many models it held.

    Signals:
        modelChosen(str): load this model file.
        foldersChanged(object): the user's own folders (a list of str) after Add folder… / Remove folder.
        scanned(object): a scan ended and its ``ScanResult`` is shown.
    """

    modelChosen = Signal(str)
    foldersChanged = Signal(object)
    scanned = Signal(object)

    def __init__(self, folders: list[str], parent: QWidget | None = None, loaded_path: str | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Model library")
        self.resize(1320, 600)
        self.folders = list(folders)
        self.loaded_path = loaded_path
        self.scan_result: ScanResult | None = None
        self.error_box: QMessageBox | None = None  # the last "cannot be loaded" box opened
        self._thread: ScanThread | None = None

        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by name, architecture, quantisation, app or path")
        self.filter_edit.setClearButtonEnabled(True)
        self._build_models_table()
        self._build_tabs()
        folders_row = self._build_folders_row()
        bottom = self._build_bottom_row()

        layout = QVBoxLayout(self)
        layout.addWidget(self.filter_edit)
        layout.addWidget(self.tabs, 1)
        layout.addLayout(folders_row)
        layout.addLayout(bottom)
        self._connect_controls()
        self._update_buttons()
        self.rescan()

    def _build_models_table(self) -> None:
        """The models found, sortable and filtered by ``filter_edit``."""
        self.model = QStandardItemModel(0, len(COLUMNS), self)
        self.model.setHorizontalHeaderLabels(list(COLUMNS))
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterKeyColumn(-1)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COLUMNS.index("File"), QHeaderView.ResizeMode.Stretch)  # long paths elide
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)

    def _build_tabs(self) -> None:
        """Models, and beside them what was skipped and where the scan looked."""
        self.skipped_table = QTableWidget(0, 3)
        self.skipped_table.setHorizontalHeaderLabels(["File or folder", "Why it was skipped", "Found in"])
        self.skipped_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.skipped_table.verticalHeader().setVisible(False)
        self.skipped_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.skipped_table.horizontalHeader().setStretchLastSection(True)

        self.searched_table = QTableWidget(0, len(SEARCHED_COLUMNS))
        self.searched_table.setHorizontalHeaderLabels(list(SEARCHED_COLUMNS))
        self.searched_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.searched_table.verticalHeader().setVisible(False)
        self.searched_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.searched_table.horizontalHeader().setStretchLastSection(True)

        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Models")
        self.tabs.addTab(self.skipped_table, "Skipped")
        self.tabs.addTab(self.searched_table, "Searched")

    def _build_folders_row(self) -> QHBoxLayout:
        """The user's own folders, with Add folder… and Remove folder."""
        self.folder_list = QListWidget()
        self.folder_list.addItems(self.folders)
        self.folder_list.setMaximumHeight(self.fontMetrics().lineSpacing() * 4 + 8)
        self.add_folder_button = QPushButton("Add folder…")
        self.remove_folder_button = QPushButton("Remove folder")
        folder_buttons = QVBoxLayout()
        folder_buttons.addWidget(self.add_folder_button)
        folder_buttons.addWidget(self.remove_folder_button)
        folder_buttons.addStretch(1)
        folders_row = QHBoxLayout()
        folders_row.addWidget(Label("Your folders:"), 0, Qt.AlignmentFlag.AlignTop)
        folders_row.addWidget(self.folder_list, 1)
        folders_row.addLayout(folder_buttons)
        return folders_row

    def _build_bottom_row(self) -> QHBoxLayout:
        """The scan's status, Rescan, Load and Close."""
        self.status_label = Label()
        self.rescan_button = QPushButton("Rescan")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.close_button = QPushButton("Close")
        bottom = QHBoxLayout()
        bottom.addWidget(self.status_label, 1)
        for button in (self.rescan_button, self.load_button, self.close_button):
            bottom.addWidget(button)
        return bottom

    def _connect_controls(self) -> None:
        self.filter_edit.textChanged.connect(self.proxy.setFilterFixedString)
        self.table.doubleClicked.connect(self._on_activated)
        self.table.selectionModel().selectionChanged.connect(self._update_buttons)
        self.add_folder_button.clicked.connect(self._on_add_folder)
        self.remove_folder_button.clicked.connect(self._on_remove_folder)
        self.folder_list.itemSelectionChanged.connect(self._update_buttons)
        self.rescan_button.clicked.connect(self.rescan)
        self.load_button.clicked.connect(self._on_load_clicked)
        self.close_button.clicked.connect(self.reject)

    # --- scanning ---

    def is_scanning(self) -> bool:
        return self._thread is not None and self._thread.isRunning()

    @Slot()
    def rescan(self) -> None:
        """Scan again (a running scan is cancelled first); cached headers make this quick."""
        self.stop_scan()
        thread = ScanThread(library_roots(self.folders), self)
        thread.progressed.connect(self._on_progress)
        thread.found.connect(self._on_found)
        thread.failed.connect(self._on_failed)
        self._thread = thread
        self.status_label.setText("Scanning…")
        self.rescan_button.setEnabled(False)
        thread.start()

    def stop_scan(self, timeout_ms: int = 5000) -> None:
        """Cancel a running scan and wait for its thread to end (it stops before the next file)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.cancel()
        for signal in (thread.progressed, thread.found, thread.failed):
            signal.disconnect()
        thread.wait(timeout_ms)

    @Slot(int, str)
    def _on_progress(self, files: int, path: str) -> None:
        self.status_label.setText(f"Scanning… {files} files")
        self.status_label.setToolTip(plain_tip(path))

    def _scan_ended(self) -> None:
        """A scan has said its last: wait the moment its thread needs to return, so that closing the dialog
        now cannot delete a thread still running (Qt aborts the process then)."""
        self._thread = None
        thread = self.sender()
        if isinstance(thread, ScanThread):
            thread.wait()

    @Slot(object)
    def _on_found(self, result: ScanResult) -> None:
        self._scan_ended()
        self.scan_result = result
        self.rescan_button.setEnabled(True)
        self._show(result)
        self.scanned.emit(result)

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        self._scan_ended()
        self.rescan_button.setEnabled(True)
        self.status_label.setText(f"The scan failed: {message}")

    def _show(self, result: ScanResult) -> None:
        self.table.setSortingEnabled(False)  # re-sorting on every row inserted is slow with many rows
        self.model.removeRows(0, self.model.rowCount())
        warning = self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
        for model in result.models:
            cells = _row(model)
            if not model.ok:
                cells[0].setIcon(warning)
            self.model.appendRow(cells)
        self.table.setSortingEnabled(True)
        self.skipped_table.setRowCount(len(result.skipped))
        for i, skipped in enumerate(result.skipped):
            for j, text in enumerate((skipped.path, skipped.reason, skipped.source)):
                self.skipped_table.setItem(i, j, QTableWidgetItem(text))
        self.tabs.setTabText(1, f"Skipped ({len(result.skipped)})")
        self._show_searched(result.searched)
        self._mark_loaded()
        broken = sum(1 for m in result.models if not m.ok)
        parts = [f"{len(result.models) - broken} models"]
        if broken:
            parts.append(f"{broken} broken")
        parts.append(f"{len(result.skipped)} skipped")
        cancelled = " (scan cancelled)" if result.cancelled else ""
        self.status_label.setText(", ".join(parts) + cancelled)
        self.status_label.setToolTip(f"{result.files_seen} files looked at in {result.seconds:.2f} s")
        self._update_buttons()

    def _show_searched(self, searched: list[SearchedFolder]) -> None:
        self.searched_table.setRowCount(len(searched))
        for i, folder in enumerate(searched):
            for j, text in enumerate((folder.path, folder.source, searched_state(folder))):
                item = QTableWidgetItem(text)
                item.setToolTip(plain_tip(folder.path))
                self.searched_table.setItem(i, j, item)
        present = sum(1 for f in searched if f.exists)
        self.tabs.setTabText(2, f"Searched ({present} of {len(searched)} on this PC)")

    def set_loaded_path(self, path: str | None) -> None:
        """Mark ``path`` as the model in use (another one was loaded while the dialog is open)."""
        self.loaded_path = path
        self._mark_loaded()

    def _mark_loaded(self) -> None:
        """Bold and "● loaded" on the row of the model in use (only there), which is selected and shown."""
        loaded_row = -1
        for row in range(self.model.rowCount()):
            first = self.model.item(row, 0)
            found = first.data(MODEL_ROLE)
            assert isinstance(found, LibraryModel)
            is_loaded = self.loaded_path is not None and same_file(found.path, self.loaded_path)
            first.setText(f"{found.name}  {LOADED_MARK}" if is_loaded else found.name)
            if found.ok:  # a broken file's tip says why it is broken (and it is never the model in use)
                first.setToolTip(plain_tip(f"The model in use\n{found.path}" if is_loaded else found.path))
            for column in range(self.model.columnCount()):
                item = self.model.item(row, column)
                font = QFont(item.font())
                font.setBold(is_loaded)
                item.setFont(font)
            if is_loaded:
                loaded_row = row
        if loaded_row >= 0:
            index = self.proxy.mapFromSource(self.model.index(loaded_row, 0))
            if index.isValid():
                self.table.selectRow(index.row())
                self.table.scrollTo(index)

    def loaded_row(self) -> int:
        """The row (as sorted and filtered now) marked as the model in use; -1 if none is."""
        for row in range(self.row_count()):
            if str(self.proxy.index(row, 0).data()).endswith(LOADED_MARK):
                return row
        return -1

    # --- reading the table ---

    def row_count(self) -> int:
        return self.proxy.rowCount()

    def model_at(self, row: int) -> LibraryModel:
        """The model shown in ``row`` (as sorted and filtered now)."""
        found = self.proxy.index(row, 0).data(MODEL_ROLE)
        assert isinstance(found, LibraryModel)
        return found

    def row_of(self, path: str) -> int:
        """The row showing ``path`` now; -1 if none does."""
        for row in range(self.row_count()):
            if self.model_at(row).path == path:
                return row
        return -1

    def selected_model(self) -> LibraryModel | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model_at(rows[0].row()) if rows else None

    # --- choosing ---

    def choose(self, model: LibraryModel) -> None:
        """Load ``model`` and close; a broken file shows why and stays in the list."""
        if not model.ok:
            problem = LoadProblem(model.problem or "This file is not a usable model.", model.error or "")
            self.error_box = model_info.show_problem(
                self, "This file cannot be loaded", problem, QMessageBox.Icon.Warning)
            return
        self.modelChosen.emit(model.path)
        self.accept()

    @Slot(QModelIndex)
    def _on_activated(self, index: QModelIndex) -> None:
        self.choose(self.model_at(index.row()))

    @Slot()
    def _on_load_clicked(self) -> None:
        model = self.selected_model()
        if model is not None:
            self.choose(model)

    # --- the user's folders ---

    def add_folder(self, folder: str) -> None:
        """Scan ``folder`` too, from now on."""
        if folder and folder not in self.folders:
            self.folders.append(folder)
            self.folder_list.addItem(folder)
            self.foldersChanged.emit(list(self.folders))
            self.rescan()

    def remove_folder(self, folder: str) -> None:
        if folder in self.folders:
            self.folders.remove(folder)
            for item in self.folder_list.findItems(folder, Qt.MatchFlag.MatchExactly):
                self.folder_list.takeItem(self.folder_list.row(item))
            self.foldersChanged.emit(list(self.folders))
            self.rescan()

    @Slot()
    def _on_add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            self.add_folder(folder)

    @Slot()
    def _on_remove_folder(self) -> None:
        item = self.folder_list.currentItem()
        if item is not None:
            self.remove_folder(item.text())

    @Slot()
    def _update_buttons(self) -> None:
        self.load_button.setEnabled(self.selected_model() is not None)
        self.remove_folder_button.setEnabled(self.folder_list.currentItem() is not None)

    # --- closing ---

    def done(self, result: int) -> None:
        self.stop_scan()
        super().done(result)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.stop_scan()
        super().closeEvent(event)
