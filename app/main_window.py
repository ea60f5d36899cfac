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
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from . import paths
from .chat_controller import ChatController, ReplyRecord, RequestIds, TurnSettings
from .coalescer import UpdateCoalescer
from .requests import LoadedModel, ReplyOutcome, StepUpdate
from .settings import AppSettings
from .store import ChatStore, export_markdown, open_chat_store
from .widgets.chat_pane import ChatPane
from .widgets.chat_view import MessageBubble
from .widgets.compare_view import CompareView
from .widgets.comparisons import Comparisons
from .widgets.conversation_list import ConversationList
from .widgets.decoding_panel import DecodingPanel
from .widgets.measure_status import MeasureStatus
from .worker import EngineThread

log = logging.getLogger(__name__)

__all__ = ["MainWindow", "ReplyRecord"]


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
        self.model: LoadedModel | None = None
        self._loading_path: str | None = None
        self._closed = False
        self._reply_bubble: MessageBubble | None = None  # where the streaming reply is drawn, if in view
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
        self._build_menus()
        self._build_status_bar()
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
        panel_scroll = QScrollArea()
        panel_scroll.setWidget(self.panel)
        panel_scroll.setWidgetResizable(True)
        panel_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        panel_scroll.setMinimumWidth(330)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        for widget, stretch in ((self.conversations, 0), (self.tabs, 1), (panel_scroll, 0)):
            self.splitter.addWidget(widget)
            self.splitter.setStretchFactor(self.splitter.count() - 1, stretch)
        self.splitter.setSizes([220, 760, 380])
        self.splitter.setChildrenCollapsible(False)
        outer = QWidget()
        outer_layout = QVBoxLayout(outer)
        outer_layout.setContentsMargins(6, 6, 6, 0)
        outer_layout.addWidget(self.splitter)
        self.setCentralWidget(outer)
        self.resize(1360, 860)

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.open_action = file_menu.addAction("&Open model…", self._on_open_model)
        self.open_action.setShortcut(QKeySequence.StandardKey.Open)
        self.recent_menu = QMenu("&Recent models", self)
        self.recent_menu.aboutToShow.connect(self._on_recent_menu_about_to_show)
        file_menu.addMenu(self.recent_menu)
        file_menu.addSeparator()
        self.export_action = file_menu.addAction("&Export chat as Markdown…", self._on_export)
        self.export_action.setShortcut(QKeySequence("Ctrl+Shift+E"))
        file_menu.addSeparator()
        quit_action = file_menu.addAction("&Quit", self.close)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)

        compare_menu = self.menuBar().addMenu("C&ompare")
        self.compare_tab_action = compare_menu.addAction("&Side by side", self.show_compare_tab)
        self.compare_tab_action.setShortcut(QKeySequence("Ctrl+K"))
        self.report_action = compare_menu.addAction("Speed &report…", self.open_speed_report)

        chat_menu = self.menuBar().addMenu("&Chat")
        self.new_action = chat_menu.addAction("&New chat", self.new_chat)
        self.new_action.setShortcut(QKeySequence("Ctrl+N"))
        self.stop_action = chat_menu.addAction("&Stop", self.stop_reply)
        self.stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.regenerate_action = chat_menu.addAction("&Regenerate last reply", self.regenerate_last)
        self.regenerate_action.setShortcut(QKeySequence("Ctrl+R"))
        self.send_action = QAction("Send", self)
        self.send_action.setShortcut(QKeySequence("Ctrl+Return"))
        self.send_action.triggered.connect(self._on_send_shortcut)
        self.addAction(self.send_action)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.model_label = QLabel("No model")
        self.lookahead_label = QLabel()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.measure_status = MeasureStatus(self.engine, can_run=lambda: self.is_ready() and not self.is_busy())
        for widget in (self.measure_status, self.progress, self.model_label, self.lookahead_label):
            bar.addPermanentWidget(widget)

    def _wire(self) -> None:
        w = self.engine.worker
        w.modelLoading.connect(self._on_model_loading)
        w.modelLoaded.connect(self._on_model_loaded)
        w.modelFailed.connect(self._on_model_failed)
        w.replyStarted.connect(self._on_reply_started)
        w.stepUpdate.connect(self._on_step_update)
        w.replyFinished.connect(self._on_reply_finished)
        w.replyFailed.connect(self._on_reply_failed)

        self.conversations.conversationSelected.connect(self._on_conversation_selected)
        self.conversations.newRequested.connect(self.new_chat)
        self.conversations.renamed.connect(self._on_conversation_renamed)
        self.conversations.deleteRequested.connect(self._on_delete_requested)
        self.chat_pane.sendRequested.connect(self.send_message)
        self.chat_pane.stopRequested.connect(self.stop_reply)
        self.chat_pane.editRequested.connect(self.begin_edit)
        self.chat_pane.regenerateRequested.connect(self.regenerate_last)
        self.chat_pane.cancelEditRequested.connect(self.cancel_edit)
        self.panel.lookaheadChanged.connect(self._on_lookahead_changed)
        self.panel.settingsChanged.connect(self._on_settings_changed)
        self.panel.systemPromptEdited.connect(self._on_system_prompt_edited)
        self.panel.makeDefaultPromptRequested.connect(self._on_make_default_prompt)
        self.panel.reloadRequested.connect(self._on_reload_requested)
        self.comparisons.busyChanged.connect(self._update_actions)
        self.comparisons.stopRequested.connect(self.stop_reply)
        self.comparisons.started.connect(self.measure_status.interrupt)
        self.comparisons.finished.connect(self.measure_status.resume_later)
        self.measure_status.message.connect(lambda text: self.statusBar().showMessage(text, 5000))

        self._steps = UpdateCoalescer(parent=self)  # one repaint per batch of steps, ~30 a second
        self._steps.flushed.connect(self._on_steps_flushed)
        self._settings_timer = QTimer(self)  # debounce: spin boxes change on every keystroke
        self._settings_timer.setSingleShot(True)
        self._settings_timer.setInterval(400)
        self._settings_timer.timeout.connect(self._save_settings)

    @Slot()
    def _show_store_notice(self) -> None:
        if self.store_notice and not self._closed:
            QMessageBox.warning(self, "Chat history", self.store_notice)

    # --- state ---

    def is_generating(self) -> bool:
        return self.chat.is_generating()

    def is_loading(self) -> bool:
        return self._loading_path is not None

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
        self.comparisons.set_ready(ready and not busy)

    # --- model ---

    def load_model(self, path: str) -> None:
        """Load ``path`` ("" = the bundled model) on the worker; the current model stays until it succeeds."""
        if self.is_busy() or self.is_loading():
            return
        self.measure_status.new_model()
        self._loading_path = path
        self.progress.setValue(0)
        self.progress.setVisible(True)
        name = Path(path).name if path else "the bundled model"
        self.statusBar().showMessage(f"Loading {name}…")
        self._update_actions()
        self.engine.loadRequested.emit(path, self.panel.n_ctx_spin.value(), self.panel.threads_spin.value())

    @Slot(float)
    def _on_model_loading(self, fraction: float) -> None:
        self.progress.setValue(int(fraction * 1000))

    @Slot(object)
    def _on_model_loaded(self, model: LoadedModel) -> None:
        requested = self._loading_path or ""
        self._loading_path = None
        self.progress.setVisible(False)
        self.model = model
        self.settings.model_path = requested  # "" keeps following the bundled model
        self.settings.add_recent_model(model.path)
        self._save_settings()
        self.model_label.setText(f"{model.display_name} · {model.file_type} · ctx {model.n_ctx}")
        checked = f" (first-open check {model.probe_s:.2f} s)" if model.probe_s is not None else ""
        self.model_label.setToolTip(
            f"{model.gguf_name} ({model.architecture}, {model.n_params / 1e6:.0f}M parameters)\n"
            f"{model.path}\n{model.n_threads} threads, loaded in {model.load_s:.2f} s{checked}"
        )
        blocked = model.lookahead_block_reason
        self.lookahead_label.setText("lookahead unavailable" if blocked else "lookahead available")
        self.lookahead_label.setToolTip(blocked or "")
        self.panel.set_lookahead_blocked(blocked)
        self.statusBar().showMessage(f"Loaded {model.display_name} in {model.load_s:.2f} s{checked}", 5000)
        self._update_actions()
        self.modelChanged.emit(model)
        self.measure_status.start()

    @Slot(str)
    def _on_model_failed(self, message: str) -> None:
        requested = self._loading_path
        self._loading_path = None
        self.progress.setVisible(False)
        self.statusBar().clearMessage()
        self._update_actions()
        if self._closed:
            return
        self.measure_status.resume_later()  # the model in use keeps its own (usually known) curve
        if self.model is None and requested:
            # The model remembered from last time is gone: fall back to the bundled one.
            QMessageBox.warning(self, "Could not load model", f"{message}\n\nLoading the bundled model instead.")
            self.modelLoadFailed.emit(message)
            self.load_model("")
            return
        QMessageBox.critical(self, "Could not load model", message)
        if self.model is None:
            self.model_label.setText("No model — use File → Open model…")
        self.modelLoadFailed.emit(message)

    @Slot()
    def _on_open_model(self) -> None:
        start = str(Path(self.model.path).parent) if self.model else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Open model", start, "GGUF models (*.gguf);;All files (*)")
        if path:
            self.load_model(path)

    @Slot()
    def _on_recent_menu_about_to_show(self) -> None:
        self.recent_menu.clear()
        for path in self.settings.recent_models:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.triggered.connect(lambda _checked=False, p=path: self.load_model(p))
        if not self.settings.recent_models:
            self.recent_menu.addAction("(none)").setEnabled(False)

    @Slot()
    def _on_reload_requested(self) -> None:
        self.load_model(self.settings.model_path)

    # --- conversations ---

    def _refresh_conversations(self, select_first: bool = False) -> None:
        convs = self.store.conversations()
        if select_first and self.chat.conversation_id is None and convs:
            self.chat.conversation_id = convs[0].id
        self.conversations.set_conversations(convs, self.chat.conversation_id)
        if select_first:
            self._show_conversation(self.chat.conversation_id)

    def _show_conversation(self, conversation_id: int | None, keep_edit: bool = False) -> None:
        """Rebuild the chat view for ``conversation_id`` (None = a new, unsaved chat)."""
        self.chat.conversation_id = conversation_id
        if not keep_edit:
            self.cancel_edit()
        conv = self.store.conversation(conversation_id) if conversation_id is not None else None
        if conv is None:
            self.chat.conversation_id = None
            self.panel.set_system_prompt(self.settings.system_prompt)
            self.setWindowTitle("Lookahead Chat")
        else:
            self.panel.set_system_prompt(conv.system_prompt)
            self.setWindowTitle(f"{conv.title} — Lookahead Chat")
        self.chat_pane.show_messages(self.chat.messages())
        turn = self.chat.turn
        self._reply_bubble = None
        if turn is not None and turn.started and turn.conversation_id == self.chat.conversation_id:
            self._reply_bubble = self.chat_pane.add_reply_bubble(turn.text)
        self.chat_view.scroll_to_bottom()
        self._update_actions()

    @Slot()
    def new_chat(self) -> None:
        """Start a new chat; it is saved once its first message is sent."""
        self._show_conversation(None)
        self.conversations.list.clearSelection()
        self.conversations.list.setCurrentItem(None)
        self.input.setFocus()

    @Slot(int)
    def _on_conversation_selected(self, conversation_id: int) -> None:
        if conversation_id != self.chat.conversation_id:
            self._show_conversation(conversation_id)

    @Slot(int, str)
    def _on_conversation_renamed(self, conversation_id: int, title: str) -> None:
        self.chat.rename_conversation(conversation_id, title)
        if conversation_id == self.chat.conversation_id:
            self.setWindowTitle(f"{title} — Lookahead Chat")

    @Slot(int)
    def _on_delete_requested(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{conv.title}” and all its messages?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        if self.chat.delete_conversation(conversation_id):
            self.stop_reply()
        self._refresh_conversations(select_first=True)

    @Slot(str)
    def _on_system_prompt_edited(self, text: str) -> None:
        self.chat.set_system_prompt(text)

    @Slot(str)
    def _on_make_default_prompt(self, text: str) -> None:
        self.settings.system_prompt = text
        self._save_settings()
        self.statusBar().showMessage("New chats will start with this system prompt", 4000)

    @Slot()
    def _on_export(self) -> None:
        conv = self.store.conversation(self.chat.conversation_id) if self.chat.conversation_id is not None else None
        if conv is None:
            return
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip() or "chat"
        path, _ = QFileDialog.getSaveFileName(
            self, "Export chat", str(Path.home() / f"{safe}.md"), "Markdown (*.md);;All files (*)"
        )
        if path:
            self.export_chat(Path(path))

    def export_chat(self, path: Path) -> None:
        """Write the open chat as Markdown to ``path``."""
        conv = self.store.conversation(self.chat.conversation_id) if self.chat.conversation_id is not None else None
        if conv is None:
            return
        try:
            path.write_text(export_markdown(conv, self.store.messages(conv.id)), encoding="utf-8")
        except OSError as exc:
            QMessageBox.critical(self, "Export failed", f"Could not write {path}: {exc}")
            return
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    # --- sending ---

    @Slot()
    def _on_send_shortcut(self) -> None:
        """Ctrl+Enter sends from the tab in view: the chat's input, or the comparison's."""
        if self.tabs.currentWidget() is self.compare_view:
            self.comparisons.start_comparison(self.compare_view.input.toPlainText())
        else:
            self.send_message()

    def _turn_settings(self) -> TurnSettings:
        return TurnSettings(
            system_prompt=self.panel.system_prompt(),
            lookahead=self.panel.lookahead_config(),
            sampling=self.panel.sampling_config(),
            stop=self.panel.stop_config(),
        )

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
        """Send the input box's text: shown at once, and given back to the box if the worker refuses it."""
        text, typed = self.chat_pane.take_input()
        if not text or not self._can_start_turn():
            return
        turn, request = self.chat.begin_send(text, typed, self._turn_settings())
        self.input.clear()
        self.chat_pane.show_pending(turn.history, text)
        self._send(request)

    @Slot()
    def regenerate_last(self) -> None:
        """Generate the last reply again (replacing it)."""
        if self.chat.conversation_id is None or not self._can_start_turn():
            return
        started = self.chat.begin_regenerate(self._turn_settings())
        if started is not None:
            self._send(started[1])

    def _send(self, request: Any) -> None:
        self.measure_status.interrupt()
        self._update_actions()
        self.engine.generateRequested.emit(request)

    @Slot(int)
    def begin_edit(self, message_id: int) -> None:
        """Put a user message back into the input; sending replaces it and what follows."""
        self.chat_pane.set_editing(self.chat.start_edit(message_id))

    @Slot()
    def cancel_edit(self) -> None:
        if self.chat.cancel_edit():
            self.chat_pane.set_editing(None)

    @Slot()
    def stop_reply(self) -> None:
        """Stop the running reply (or comparison, or speed report) before its next step (Esc)."""
        if self.is_busy():
            self.engine.stopRequested.emit()
        else:
            self.cancel_edit()

    @Slot(object)
    def _on_lookahead_changed(self, config: object) -> None:
        if self.is_generating():
            self.engine.lookaheadChanged.emit(config)  # takes effect at the next step

    # --- comparison and speed report ---

    @Slot()
    def show_compare_tab(self) -> None:
        self.tabs.setCurrentWidget(self.compare_view)
        self.compare_view.input.setFocus()

    @Slot()
    def open_speed_report(self) -> Any:
        """Show the speed report dialog (see ``Comparisons``)."""
        return self.comparisons.open_speed_report()

    # --- the worker's answers ---

    @Slot(int)
    def _on_reply_started(self, request_id: int) -> None:
        turn = self.chat.accept(request_id)
        if turn is None:
            return
        if turn.user_text is not None:
            self.chat_pane.set_editing(None)
        self._refresh_conversations()
        self._show_conversation(turn.conversation_id)
        self.panel.live.reset()
        self._steps.clear()

    @Slot(object)
    def _on_step_update(self, update: StepUpdate) -> None:
        if self.chat.note_step(update.request_id, update.event) is None:
            return
        self._steps.push(update)
        self.replyStepReceived.emit(update)

    @Slot(list)
    def _on_steps_flushed(self, updates: list[StepUpdate]) -> None:
        """Draw a batch of steps at once: one Markdown render and one chart update."""
        turn = self.chat.turn
        if turn is None or not updates:
            return
        new_steps = self.chat.observe([u.event for u in updates])
        bubble = self._reply_bubble
        if bubble is not None:
            bubble.set_text(turn.text)
            if turn.text and bubble.stats_label.text():
                bubble.set_stats_line("")
        self.panel.live.show_progress(turn.stats, new_steps, updates[-1].event)

    @Slot(object)
    def _on_reply_finished(self, outcome: ReplyOutcome) -> None:
        if self.chat.current(outcome.request_id) is None:
            return
        self._steps.flush()
        finished = self.chat.finish(outcome, self.model.display_name if self.model else "")
        assert finished is not None
        turn, record = finished
        bubble, self._reply_bubble = self._reply_bubble, None
        if bubble is not None:
            if record.message_id is None:
                self._show_conversation(self.chat.conversation_id)
            else:
                bubble.message_id = record.message_id
                bubble.set_stats_line(record.stats.summary_line())
        self._update_actions()
        self.measure_status.resume_later()
        if outcome.error and not self._closed:
            QMessageBox.warning(self, "The reply failed", outcome.error)
        self.replyCompleted.emit(record)

    @Slot(int, str)
    def _on_reply_failed(self, request_id: int, message: str) -> None:
        turn = self.chat.reject(request_id)
        if turn is None:
            return
        self._steps.clear()
        if turn.user_text is not None:
            # Nothing was saved: show the chat as it is, and give the typed text back.
            self.chat_pane.give_back(turn.typed)
            self._show_conversation(self.chat.conversation_id, keep_edit=True)
        self._update_actions()
        self.measure_status.resume_later()
        if not self._closed:
            QMessageBox.warning(self, "Could not send", message)
        self.replyRejected.emit(message)

    # --- settings ---

    @Slot()
    def _on_settings_changed(self) -> None:
        self._settings_timer.start()

    def _save_settings(self) -> None:
        self.panel.store_settings(self.settings)
        self.settings.geometry = base64.b64encode(bytes(self.saveGeometry().data())).decode("ascii")
        self.settings.splitter_state = base64.b64encode(bytes(self.splitter.saveState().data())).decode("ascii")
        try:
            self.settings.save()
        except OSError as exc:
            log.warning("could not save settings: %s", exc)

    def _restore_geometry(self) -> None:
        try:
            if self.settings.geometry:
                self.restoreGeometry(QByteArray(base64.b64decode(self.settings.geometry)))
            if self.settings.splitter_state:
                self.splitter.restoreState(QByteArray(base64.b64decode(self.settings.splitter_state)))
        except ValueError:
            pass  # a damaged value: keep the default layout

    # --- closing ---

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt name)
        if self._closed:
            event.accept()
            return
        self._closed = True
        t0 = time.perf_counter()
        self._settings_timer.stop()
        self.engine.shutdown(timeout_s=2.0)
        # The worker's last signals (final step, replyFinished) are queued to us: deliver them now,
        # so a reply stopped by closing is saved as far as it got.
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)
        turn = self.chat.turn
        if turn is not None and turn.started:
            self._on_reply_finished(ReplyOutcome(turn.request_id, "cancelled", turn.stats.n_tokens, 0))
        self._steps.clear()
        self.comparisons.shutdown()
        self._save_settings()
        if self._owns_store:
            self.store.close()
        log.info("closed in %.2f s", time.perf_counter() - t0)
        event.accept()
