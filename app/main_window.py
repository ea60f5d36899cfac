"""The main window: chats on the left, the conversation in the middle, decoding on the right.

The window assembles the parts and wires their signals. The chat's logic (turns,
request ids, what is saved) is ``ChatController``'s; comparisons and speed
reports are ``Comparisons``'; measuring this PC at idle is ``MeasureStatus``'s.
Nothing here calls the engine: requests go to the ``EngineWorker`` through
``EngineThread``'s signals. Step events are buffered and drawn by a ~30 Hz
timer, so a fast model cannot flood the event loop with repaints.
"""

from __future__ import annotations

import base64
import functools
import importlib.metadata
import logging
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import platformdirs
from PySide6 import __version__ as pyside_version
from PySide6.QtCore import (
    QByteArray,
    QCoreApplication,
    QEvent,
    QMargins,
    QRect,
    QSize,
    Qt,
    QTimer,
    QUrl,
    Signal,
    Slot,
    qVersion,
)
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDesktopServices,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import ModelFileError, default_model_path
from engine.library.names import DRAFTS_ONLY_NOTE

from . import paths
from .chat_controller import ChatController, ReplyRecord, RequestIds
from .chat_runner import ChatRunner
from .model_loader import ModelLoader
from .requests import LoadedModel
from .serving import ServerController
from .settings import AppSettings
from .store import ChatStore, Conversation, open_chat_store
from .wheel_guard import install_wheel_guard
from .widgets import plain
from .widgets.chat_pane import ChatPane
from .widgets.compare_view import CompareView
from .widgets.comparisons import Comparisons
from .widgets.conversation_list import ConversationList
from .widgets.decoding_panel import DecodingPanel
from .widgets.library import LibraryDialog
from .widgets.measure_status import MeasureStatus
from .widgets.model_info import ModelInfoDialog
from .widgets.serve_dialog import ServeDialog
from .widgets.shortcuts import ShortcutsDialog, shortcut_rows
from .widgets.side_panels import DEFAULT_SPLITTER_SIZES, SidePanels
from .worker import EngineThread

log = logging.getLogger(__name__)

__all__ = ["MainWindow", "ReplyRecord"]

DEFAULT_SIZE = QSize(1360, 860)  # the first window's size on a screen with room for it
# What the window system adds around the window (title bar, borders): it says how much only once the window is shown.
FRAME_ALLOWANCE = QMargins(8, 32, 8, 8)


class MainWindow(QMainWindow):
    """Lookahead Chat's window.

    Signals:
        modelChanged(object): a ``LoadedModel`` is now in use.
        modelLoadFailed(str): a model failed to load (the error dialog has been shown).
        replyStepReceived(object): every ``StepUpdate`` as it arrives, before coalescing.
        replyCompleted(object): a ``ReplyRecord`` once a reply is over and saved.
        replyRejected(str): the worker refused a message (dialog shown, input kept).
    """

    modelChanged = Signal(object)
    modelLoadFailed = Signal(str)
    replyStepReceived = Signal(object)
    replyCompleted = Signal(object)
    replyRejected = Signal(str)

    def __init__(
        self,
        settings: AppSettings | None = None,
        store: ChatStore | None = None,
        *,
        load_model: bool = True,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        """``worker_options`` go to the engine's worker (its engine and session factories; tests pass fakes)."""
        super().__init__()
        self.settings = settings if settings is not None else AppSettings.load()
        self._owns_store = store is None
        self.store_notice: str | None = None  # what went wrong opening the chat database, for the user
        if store is None:
            store, self.store_notice = open_chat_store()
        self.store = store
        self._closed = False
        install_wheel_guard()  # the wheel scrolls; only a focused field takes it (also for windows tests make)
        ids = RequestIds()
        self.chat = ChatController(self.store, ids)

        self.setWindowTitle("Lookahead Chat")
        icon = paths.resources_dir() / "icons" / "lookahead-chat.svg"
        if icon.is_file():
            self.setWindowIcon(QIcon(str(icon)))
        self.engine = EngineThread(self, **dict(worker_options or {}))
        self._build_widgets()
        self.comparisons = Comparisons(
            self.compare_view, self.panel, self.engine, ready=lambda: self.is_ready() and not self.is_busy(),
            lookahead_block_reason=lambda: self.model.lookahead_block_reason if self.model else None,
            next_id=ids.next, parent_widget=self,
        )
        self.serving = ServerController(self.engine, self.settings, self)
        self._build_status_bar()
        self.runner = ChatRunner(
            self.chat, self.chat_pane, self.conversations, self.panel, self.engine, can_start=self._can_start_turn,
            model_name=lambda: self.model.display_name if self.model else "", dialog_parent=self,
        )
        self._build_menus()
        self._build_view_menu()
        self._build_chat_menus()
        self._build_help_menu()
        self._wire()

        self.panel.load_settings(self.settings)
        self._restore_geometry()
        self._refresh_conversations(select_first=True)
        self._update_actions()
        if load_model:
            self.load_model(self.settings.model_path)
        if self.store_notice:
            QTimer.singleShot(0, self._show_store_notice)  # once the window is up

    # --- construction ---

    def _build_widgets(self) -> None:
        self.conversations = ConversationList()
        self.chat_pane = ChatPane()
        # The pane's parts, by the names the rest of the app and its tests use.
        self.chat_view = self.chat_pane.chat_view
        self.input = self.chat_pane.input
        self.send_button = self.chat_pane.send_button
        self.edit_banner = self.chat_pane.edit_banner
        self.cancel_edit_button = self.chat_pane.cancel_edit_button

        self.compare_view = CompareView()
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.chat_pane, "Chat")
        self.tabs.addTab(self.compare_view, "Compare: plain vs lookahead")

        self.panel = DecodingPanel()
        self.panel_scroll = QScrollArea()
        self.panel_scroll.setWidget(self.panel)
        self.panel_scroll.setWidgetResizable(True)
        self.panel_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        for widget, stretch in ((self.conversations, 0), (self.tabs, 1), (self.panel_scroll, 0)):
            self.splitter.addWidget(widget)
            self.splitter.setStretchFactor(self.splitter.count() - 1, stretch)
        self.splitter.setSizes(list(DEFAULT_SPLITTER_SIZES))
        self.splitter.setChildrenCollapsible(False)
        outer = QWidget()
        outer_layout = QVBoxLayout(outer)
        outer_layout.setContentsMargins(6, 6, 6, 0)
        outer_layout.addWidget(self.splitter)
        self.setCentralWidget(outer)
        self.resize(DEFAULT_SIZE)

    def _build_menus(self) -> None:
        def menu(title: str, *items: tuple[str, Any, Any] | QMenu | None) -> list[QAction]:
            """A menu of (text, slot, shortcut) items, submenus, and separators (None); returns the items' actions."""
            m, actions = self.menuBar().addMenu(title), []
            for item in items:
                if item is None:
                    m.addSeparator()
                    continue
                if isinstance(item, QMenu):
                    m.addMenu(item)
                    continue
                action = m.addAction(item[0], item[1])
                if item[2] is not None:
                    action.setShortcut(QKeySequence(item[2]))
                actions.append(action)
            return actions

        self.recent_menu = QMenu("&Recent models", self)
        self.recent_menu.aboutToShow.connect(self._on_recent_menu_about_to_show)
        self.open_action, self.export_action, _quit = menu(
            "&File", ("&Open model…", self._on_open_model, QKeySequence.StandardKey.Open), self.recent_menu, None,
            ("&Export chat as Markdown…", self._on_export, "Ctrl+Shift+E"), None,
            ("&Quit", self.close, QKeySequence.StandardKey.Quit),
        )
        self.open_action.setToolTip("Load a GGUF model file from disk")
        self.compare_tab_action, self.report_action = menu(
            "C&ompare", ("&Side by side", self.show_compare_tab, "Ctrl+K"),
            ("Speed &report…", self.comparisons.open_speed_report, None),
        )
        self.new_action, self.stop_action, self.regenerate_action = menu(
            "&Chat", ("&New chat", self.new_chat, "Ctrl+N"), ("&Stop", self.stop_reply, Qt.Key.Key_Escape),
            ("&Regenerate last reply", self.regenerate_last, "Ctrl+R"),
        )
        self.library_action, self.template_action, self.serve_action = menu(
            "&Model", ("&Library…", self._on_open_library, "Ctrl+Shift+L"),
            ("Chat &template…", self._on_show_chat_template, None), None,
            ("&Serve to other programs…", self.show_serve_dialog, None),
        )
        self.serve_action.setToolTip("Let other programs on this PC use the loaded model through the OpenAI API")
        self.serve_dialog: ServeDialog | None = None
        # Opening a model is a model's business: the Model menu has it first; File keeps the same action.
        self.model_menu = self.library_action.parent()
        assert isinstance(self.model_menu, QMenu)
        self.model_menu.insertAction(self.library_action, self.open_action)
        self.model_menu.insertSeparator(self.library_action)
        self.library_dialog: LibraryDialog | None = None
        self.send_action = QAction("Send", self)
        self.send_action.setShortcut(QKeySequence("Ctrl+Return"))
        self.send_action.triggered.connect(self._on_send_shortcut)
        self.addAction(self.send_action)

    def _build_view_menu(self) -> None:
        self.show_lookahead_action = QAction("Show &lookahead in replies", self)
        self.show_lookahead_action.setCheckable(True)
        self.show_lookahead_action.setShortcut(QKeySequence("Ctrl+L"))
        self.show_lookahead_action.setToolTip("Tint the text each draft source gave; hover a run for its step")
        self.show_lookahead_action.setChecked(self.settings.show_lookahead)
        self.show_lookahead_action.toggled.connect(self._on_show_lookahead)
        view_menu = self.menuBar().addMenu("&View")
        view_menu.addAction(self.show_lookahead_action)
        self._on_show_lookahead(self.settings.show_lookahead)

        # The side panels: a narrow window puts the chats list away and narrows the panel; these bring them back.
        self.side_panels = SidePanels(
            self, self.splitter, self.conversations, self.tabs, self.panel_scroll,
            show_chats=self.settings.show_chat_list, show_panel=self.settings.show_decoding_panel,
            chosen=self._on_side_panel_chosen,
        )
        self.chat_list_action = self.side_panels.chat_list_action
        self.panel_action = self.side_panels.panel_action
        view_menu.addSeparator()
        view_menu.addActions([self.chat_list_action, self.panel_action])

    def _build_help_menu(self) -> None:
        help_menu = self.menuBar().addMenu("&Help")
        self.shortcuts_action = help_menu.addAction("&Keyboard shortcuts", self.show_shortcuts)
        self.shortcuts_action.setShortcut(QKeySequence(QKeySequence.StandardKey.HelpContents))
        self.log_folder_action = help_menu.addAction("Open &log folder", self.open_log_folder)
        self.about_action = help_menu.addAction("&About Lookahead Chat", self.show_about)

    def _build_chat_menus(self) -> None:
        """The chats as a whole (the runner's actions): the JSON backup in File, search in Chat."""
        file_menu, chat_menu = self.export_action.parent(), self.new_action.parent()
        assert isinstance(file_menu, QMenu) and isinstance(chat_menu, QMenu)
        items = file_menu.actions()
        after_export = items[items.index(self.export_action) + 1]
        file_menu.insertActions(after_export, [self.runner.export_json_action, self.runner.export_all_json_action,
                                               self.runner.import_json_action])
        chat_menu.addSeparator()
        chat_menu.addActions([self.runner.find_action, self.runner.search_action])
        self.runner.status.connect(lambda text: self.statusBar().showMessage(text, 5000))

    # --- side panels ---

    def _on_side_panel_chosen(self, setting: str, shown: bool) -> None:
        """The user showed or hid a side panel: kept in the settings (``SidePanels`` keeps it on resizing)."""
        setattr(self.settings, setting, shown)
        self._save_settings()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        self.side_panels.window_resized()

    def is_narrow(self) -> bool:
        """The window is narrower than ``NARROW_WINDOW_WIDTH``: the side panels give way to the chat."""
        return self.side_panels.is_narrow()

    # --- help ---

    def shortcut_actions(self) -> list[QAction]:
        """Every action of the window, in menu order first, then those that live outside the menus."""
        actions: list[QAction] = []

        def walk(menu_actions: list[QAction]) -> None:
            for action in menu_actions:
                actions.append(action)
                submenu = action.menu()
                if isinstance(submenu, QMenu):
                    walk(submenu.actions())

        walk(self.menuBar().actions())
        actions.extend(self.actions())
        actions.extend(self.findChildren(QAction))
        return actions

    @Slot()
    def show_shortcuts(self) -> ShortcutsDialog:
        """Help → Keyboard shortcuts (F1): read from the actions themselves, so the list is always current."""
        dialog = ShortcutsDialog(shortcut_rows(self.shortcut_actions()), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    @Slot()
    def open_log_folder(self) -> None:
        """Help → Open log folder: the app's log files (warnings, tracebacks) in the system's file manager."""
        try:
            folder = paths.log_dir()
        except OSError as exc:
            self.statusBar().showMessage(f"Could not open the log folder: {exc}", 8000)
            return
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    @Slot()
    def show_about(self) -> QMessageBox:
        """Help → About Lookahead Chat: what it is, its version and what it runs on."""
        try:
            version = importlib.metadata.version("lookahead-chat")
        except importlib.metadata.PackageNotFoundError:
            version = "(development copy)"
        model = f"<p>Model in use: {plain.escape(self.model.display_name)}</p>" if self.model else ""
        text = (
            f"<h3>Lookahead Chat {version}</h3>"
            "<p>Chat with a local GGUF model on this computer. Lookahead decoding guesses several tokens ahead "
            "and checks the guesses in the same forward pass, so a reply can take fewer passes.</p>"
            f"{model}<p>Qt {qVersion()} · PySide6 {pyside_version} · Python {platform.python_version()}</p>"
        )
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About Lookahead Chat", text, QMessageBox.StandardButton.Close,
                          self)
        box.setTextFormat(Qt.TextFormat.RichText)
        if not self.windowIcon().isNull():
            box.setIconPixmap(self.windowIcon().pixmap(64, 64))
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    @Slot(bool)
    def _on_show_lookahead(self, on: bool) -> None:
        self.chat_pane.set_show_lookahead(on)
        self.compare_view.set_show_lookahead(on)
        if on != self.settings.show_lookahead:
            self.settings.show_lookahead = on
            self._save_settings()

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.models = ModelLoader(self.engine, self)
        self.model_label, self.lookahead_label, self.progress = (
            self.models.model_label, self.models.lookahead_label, self.models.progress)
        self.measure_status = MeasureStatus(self.engine, can_run=lambda: self.is_ready() and not self.is_busy())
        self.serving_label = QLabel()
        self.serving_label.setTextFormat(Qt.TextFormat.PlainText)
        self.serving_label.hide()
        for widget in (self.measure_status, self.progress, self.serving_label, self.model_label, self.lookahead_label):
            bar.addPermanentWidget(widget)

    def _wire(self) -> None:
        self.models.loaded.connect(self._on_model_loaded)
        self.models.failed.connect(self._on_model_failed)
        self.models.loadingChanged.connect(self._update_actions)
        self.runner.conversationShown.connect(self._on_conversation_shown)
        self.runner.turnStarted.connect(self._update_actions)
        self.runner.stepReceived.connect(self.replyStepReceived)
        self.runner.completed.connect(self.replyCompleted)
        self.runner.rejected.connect(self.replyRejected)
        self.runner.busyChanged.connect(self._update_actions)
        self.runner.requestSent.connect(self.measure_status.interrupt)
        self.chat_pane.attachmentsChanged.connect(self.measure_status.make_way)
        self.runner.turnEnded.connect(self.measure_status.resume_later)

        self.runner.stopRequested.connect(self.stop_reply)
        self.chat_pane.stopRequested.connect(self.stop_reply)
        self.panel.settingsChanged.connect(self._on_settings_changed)
        self.panel.systemPromptEdited.connect(self.chat.set_system_prompt)
        self.panel.makeDefaultPromptRequested.connect(self._on_make_default_prompt)
        self.panel.reloadRequested.connect(self._on_reload_requested)
        self.comparisons.busyChanged.connect(self._update_actions)
        self.comparisons.stopRequested.connect(self.stop_reply)
        self.comparisons.started.connect(self.measure_status.interrupt)
        self.comparisons.finished.connect(self.measure_status.resume_later)
        self.measure_status.message.connect(lambda text: self.statusBar().showMessage(text, 5000))
        self.serving.requestArrived.connect(self.measure_status.make_way)
        self.runner.requestSent.connect(self._say_if_a_program_goes_first)
        self.serving.stateChanged.connect(self._on_serving_changed)

        self._settings_timer = QTimer(self)  # debounce: spin boxes change on every keystroke
        self._settings_timer.setSingleShot(True)
        self._settings_timer.setInterval(400)
        self._settings_timer.timeout.connect(self._save_settings)

    @Slot()
    def _show_store_notice(self) -> None:
        if self.store_notice and not self._closed:
            plain.show_message(self, plain.Icon.Warning, "Chat history", self.store_notice)

    # --- state ---

    def is_generating(self) -> bool:
        return self.chat.is_generating()

    def is_loading(self) -> bool:
        return self.models.is_loading()

    def is_ready(self) -> bool:
        """A model is loaded and no other is being loaded."""
        return self.model is not None and not self.is_loading()

    def is_comparing(self) -> bool:
        return self.comparisons.is_comparing()

    def is_reporting(self) -> bool:
        return self.comparisons.is_reporting()

    def is_busy(self) -> bool:
        """The engine is working for the chat, a comparison or a speed report."""
        return self.is_generating() or self.is_comparing() or self.is_reporting()

    def current_conversation_id(self) -> int | None:
        return self.chat.conversation_id

    @Slot()
    def _update_actions(self) -> None:
        busy, ready = self.is_busy(), self.is_ready()
        self.chat_pane.set_state(self.is_generating(), can_send=ready and not busy, busy=busy or not ready)
        self.stop_action.setEnabled(busy)
        self.regenerate_action.setEnabled(ready and not busy and self.chat.conversation_id is not None)
        for widget in (self.open_action, self.recent_menu, self.panel.reload_button):
            widget.setEnabled(not busy and not self.is_loading())
        self.export_action.setEnabled(self.chat.conversation_id is not None)
        self.template_action.setEnabled(self.model is not None)
        self.comparisons.set_ready(ready and not busy)

    # --- model ---

    @property
    def model(self) -> LoadedModel | None:
        """The model in use (None before the first load succeeds)."""
        return self.models.model

    def load_model(self, path: str) -> None:
        """Load ``path`` ("" = the bundled model) on the worker; the current model stays until it succeeds."""
        if self.is_busy() or self.is_loading():
            return
        self.measure_status.new_model()
        n_ctx, threads = self.panel.n_ctx_spin.value(), self.panel.threads_spin.value()
        model_file = self._model_file(path)
        if self.model is None or model_file != self.model.path:  # another model: load it as it was last time
            remembered = self.settings.model_settings(model_file)
            ctx, thr = remembered.get("n_ctx"), remembered.get("threads")
            n_ctx = ctx if isinstance(ctx, int) else n_ctx
            threads = thr if isinstance(thr, int) else threads
        self.serving.model_changing()
        self.models.load(path, n_ctx, threads)

    @staticmethod
    def _model_file(path: str) -> str:
        """The file ``path`` names, as the loaded model reports it ("" = the bundled model)."""
        if path:
            return str(Path(path))
        try:
            return str(default_model_path())
        except ModelFileError:
            return ""

    @Slot(object, str)
    def _on_model_loaded(self, model: LoadedModel, requested: str) -> None:
        if self.settings.apply_model_settings(model.path):  # this model's own context, sampling and prompt
            self.panel.load_settings(self.settings)
            if self.chat.conversation_id is None:
                self.panel.set_system_prompt(self.settings.system_prompt)
            else:  # the open chat keeps the sampling values it was saved with
                self.panel.load_chat_settings(self.store.conversation_settings(self.chat.conversation_id))
        self.settings.model_path = requested  # "" keeps following the bundled model
        self.settings.add_recent_model(model.path)
        self._save_settings()
        self.panel.set_lookahead_blocked(
            model.lookahead_block_reason, DRAFTS_ONLY_NOTE if model.lookahead_kind == "drafts only" else "")
        self.chat_pane.context_meter.set_context(model.n_ctx)
        self._update_actions()
        # Earlier chats with this model, for lookahead to draft from (tokenized on the engine's thread).
        names = {model.display_name, Path(model.path).stem}  # the file's name: what chats were stored under before
        self.engine.rememberRequested.emit(model.path, self.store.chat_texts(names))
        self.modelChanged.emit(model)
        self.measure_status.start()
        self.serving.model_loaded(model)
        if self.library_dialog is not None:
            self.library_dialog.set_loaded_path(model.path)

    @Slot(str)
    def _on_model_failed(self, message: str) -> None:
        self._update_actions()
        if not self._closed:
            if self.model is not None:
                self.serving.model_loaded(self.model)  # the model in use stays: serve it again
            self.measure_status.resume_later()  # the model in use keeps its own (usually known) curve
            self.modelLoadFailed.emit(message)

    @Slot()
    def _on_open_model(self) -> None:
        """Model → Open model… (Ctrl+O): a GGUF file from disk; its folder is where the next one starts."""
        start = self.model_dialog_folder()
        path, _ = QFileDialog.getOpenFileName(self, "Open model", start, "GGUF models (*.gguf);;All files (*)")
        if path:
            self.settings.last_model_folder = str(Path(path).parent)
            self._save_settings()
            self.load_model(path)

    def model_dialog_folder(self) -> str:
        """Where Open model… starts: the folder a model was last opened from, else Downloads, else home.

        Never the bundled model's folder: that is inside the app's own installation.
        """
        for folder in (self.settings.last_model_folder, _downloads_folder()):
            if folder and Path(folder).is_dir():
                return folder
        return str(Path.home())

    @Slot()
    def _on_recent_menu_about_to_show(self) -> None:
        self.recent_menu.clear()
        for path in self.settings.recent_models:
            name = plain.menu_text(Path(path).name)
            action = self.recent_menu.addAction(name, functools.partial(self.load_model, path))
            action.setToolTip(plain.tip(path))
        if not self.settings.recent_models:
            self.recent_menu.addAction("(none)").setEnabled(False)

    @Slot()
    def _on_open_library(self) -> None:
        """Model → Library…: the models other apps keep on this machine (one dialog at a time)."""
        if self.library_dialog is not None:
            self.library_dialog.raise_()
            self.library_dialog.activateWindow()
            return
        dialog = LibraryDialog(self.settings.library_folders, self, self.model.path if self.model else None)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.modelChosen.connect(self._on_library_model_chosen)
        dialog.foldersChanged.connect(self._on_library_folders_changed)
        dialog.finished.connect(self._on_library_closed)
        self.library_dialog = dialog
        dialog.open()

    @Slot(str)
    def _on_library_model_chosen(self, path: str) -> None:
        if self.is_busy() or self.is_loading():
            self.statusBar().showMessage("Wait for the reply or the load under way before loading another model", 5000)
            return
        self.load_model(path)

    @Slot(object)
    def _on_library_folders_changed(self, folders: list[str]) -> None:
        self.settings.library_folders = list(folders)
        self._save_settings()

    @Slot()
    def _on_library_closed(self) -> None:
        self.library_dialog = None

    @Slot()
    def _on_show_chat_template(self) -> None:
        """Model → Chat template…: the model's facts and its template, read-only (closed dialogs are freed)."""
        if self.model is None:
            return
        dialog = ModelInfoDialog(self.model, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    @Slot()
    def show_serve_dialog(self) -> ServeDialog:
        """Model → Serve to other programs…: one dialog, raised when open."""
        if self.serve_dialog is not None and self.serve_dialog.isVisible():
            self.serve_dialog.raise_()
            self.serve_dialog.activateWindow()
            return self.serve_dialog
        if self.serve_dialog is None:
            self.serve_dialog = ServeDialog(self.serving, self)
        self.serve_dialog.show()
        return self.serve_dialog

    @Slot()
    def _on_serving_changed(self) -> None:
        """The status bar says where the model is served; the settings are saved."""
        serving = self.serving
        self.serving_label.setVisible(serving.running)
        if serving.running:
            self.serving_label.setText("Serving")
            self.serving_label.setToolTip(f"Other programs can use the loaded model at {serving.base_url} "
                                          "(Model → Serve to other programs…)")
        self._settings_timer.start()

    @Slot()
    def _say_if_a_program_goes_first(self) -> None:
        """A reply asked for while another program's request runs starts after it: say so, or the wait looks like
        a hang."""
        if self.serving.busy:
            self.statusBar().showMessage(
                "Another program's request to the model is being answered; this reply starts when it is done", 15000)

    @Slot()
    def _on_reload_requested(self) -> None:
        self.load_model(self.settings.model_path)

    # --- conversations ---

    def _refresh_conversations(self, select_first: bool = False) -> None:
        self.runner.refresh_conversations(select_first)
        self._update_actions()

    @Slot(object)
    def _on_conversation_shown(self, conv: Conversation | None) -> None:
        self.panel.set_system_prompt(conv.system_prompt if conv else self.settings.system_prompt)
        self.setWindowTitle(f"{conv.title} — Lookahead Chat" if conv else "Lookahead Chat")
        self._update_actions()

    @Slot()
    def new_chat(self) -> None:
        """Start a new chat; it is saved once its first message is sent (Ctrl+N)."""
        self.runner.new_chat()

    @Slot(str)
    def _on_make_default_prompt(self, text: str) -> None:
        self.settings.system_prompt = text
        self._save_settings()
        self.statusBar().showMessage("New chats will start with this system prompt", 4000)

    @Slot()
    def _on_export(self) -> None:
        export = self.chat.markdown_export()
        if export is not None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Export chat", str(Path.home() / export[0]), "Markdown (*.md);;All files (*)"
            )
            if path:
                self.export_chat(Path(path))

    def export_chat(self, path: Path) -> None:
        """Write the open chat as Markdown to ``path``."""
        export = self.chat.markdown_export()
        try:
            if export is not None:
                path.write_text(export[1], encoding="utf-8")
                self.statusBar().showMessage(f"Exported to {path}", 5000)
        except OSError as exc:
            plain.export_failed(self, path, exc)

    # --- sending ---

    @Slot()
    def _on_send_shortcut(self) -> None:
        """Ctrl+Enter sends from the tab in view: the chat's input, or the comparison's."""
        if self.tabs.currentWidget() is self.compare_view:
            self.comparisons.start_comparison(self.compare_view.input.toPlainText())
        else:
            self.send_message()

    def _can_start_turn(self) -> bool:
        """The one "is a model ready" check before the chat asks the engine for a reply."""
        if self.is_busy():
            return False
        if not self.is_ready():
            self.statusBar().showMessage("Wait for the model to load before sending", 4000)
            return False
        return True

    @Slot()
    def send_message(self) -> None:
        """Send the input box's text (Enter, Send, Ctrl+Enter)."""
        self.runner.send_message()

    @Slot()
    def regenerate_last(self) -> None:
        """Generate the last reply again, beside it: the old one stays as an alternative (Ctrl+R)."""
        self.runner.regenerate_last()

    @Slot()
    def stop_reply(self) -> None:
        """Stop the running reply (or comparison, or speed report) before its next step (Esc)."""
        if self.is_busy():
            self.engine.stopRequested.emit()
        else:
            self.runner.cancel_edit()

    # --- comparison and speed report ---

    @Slot()
    def show_compare_tab(self) -> None:
        self.tabs.setCurrentWidget(self.compare_view)
        self.compare_view.input.setFocus()

    def open_speed_report(self) -> Any:
        """Show the speed report dialog (see ``Comparisons``)."""
        return self.comparisons.open_speed_report()

    # --- settings ---

    @Slot()
    def _on_settings_changed(self) -> None:
        self._settings_timer.start()

    def _save_settings(self) -> None:
        self.panel.store_settings(self.settings)
        if self.model is not None:
            self.settings.remember_model_settings(self.model.path)
        self.settings.geometry = _encode(self.saveGeometry())
        state = self.side_panels.splitter_state()  # as the user arranged it, not as a narrow window narrowed it
        self.settings.splitter_state = _encode(state)
        try:
            self.settings.save()
        except OSError as exc:
            log.warning("could not save settings: %s", exc)

    def _restore_geometry(self) -> None:
        restored = False
        try:
            if self.settings.geometry:
                restored = self.restoreGeometry(QByteArray(base64.b64decode(self.settings.geometry)))
            if self.settings.splitter_state:
                self.splitter.restoreState(QByteArray(base64.b64decode(self.settings.splitter_state)))
        except ValueError:
            pass  # a damaged value: keep the default layout
        screen = self.screen() or QGuiApplication.primaryScreen()
        if screen is None or self.isMaximized() or self.isFullScreen():
            return
        fitted = fit_to_screen(self.geometry(), screen.availableGeometry(), self.minimumSizeHint(), centre=not restored)
        if fitted != self.geometry():
            self.setGeometry(fitted)

    # --- closing ---

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt name)
        if self._closed:
            event.accept()
            return
        self._closed = True
        self.models.closed = True
        t0 = time.perf_counter()
        self._settings_timer.stop()
        self.chat_pane.stop_reading()  # files being read for a message: their threads end now
        self.serving.shutdown()  # requests of other programs hear that the app is closing
        self.engine.shutdown(timeout_s=2.0)
        # The worker's last signals (final step, replyFinished) are queued to us: deliver them now,
        # so a reply stopped by closing is saved as far as it got.
        QCoreApplication.sendPostedEvents(None, QEvent.Type.MetaCall)
        self.runner.close_turn()
        self.comparisons.shutdown()
        if self.library_dialog is not None:
            self.library_dialog.close()  # cancels its scan and ends the scan's thread
        self._save_settings()
        if self._owns_store:
            self.store.close()
        log.info("closed in %.2f s", time.perf_counter() - t0)
        event.accept()


def fit_to_screen(window: QRect, available: QRect, minimum: QSize, centre: bool) -> QRect:
    """``window`` (its inside, as ``geometry()``) made to fit the screen's free area with its frame around it: no
    bigger (but not below ``minimum``) and moved inside; ``centre`` places it in the middle, as for a first window,
    else it moves only as far as it must."""
    frame = FRAME_ALLOWANCE
    room = available.marginsRemoved(frame)
    fitted = QRect(window.topLeft(), QSize(
        max(minimum.width(), min(window.width(), room.width())),
        max(minimum.height(), min(window.height(), room.height())),
    ))
    if centre:
        fitted.moveCenter(room.center())
    fitted.moveLeft(max(room.left(), min(fitted.left(), room.right() + 1 - fitted.width())))
    fitted.moveTop(max(room.top(), min(fitted.top(), room.bottom() + 1 - fitted.height())))
    return fitted


def _downloads_folder() -> str:
    """The user's Downloads folder, or "" if the platform has none."""
    try:
        return platformdirs.user_downloads_dir()
    except (OSError, RuntimeError):
        return ""


def _encode(state: QByteArray) -> str:
    return base64.b64encode(bytes(state.data())).decode("ascii")
