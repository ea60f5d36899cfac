"""The main window: chats on the left, the conversation in the middle, decoding on the right.

The window never calls the engine. It sends requests to the ``EngineWorker``
through ``EngineThread``'s signals and reacts to the worker's signals. Step
events arrive one per forward pass; they are buffered and drawn by a ~30 Hz
timer, so a fast model cannot flood the event loop with repaints.
"""

from __future__ import annotations

import base64
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import LookaheadConfig, Message
from engine.bench import Workload, load_workloads

from . import paths
from .coalescer import UpdateCoalescer
from .compare import CompareRequest, SpeedReportOutcome, SpeedReportRequest
from .settings import AppSettings
from .stats import ReplyStats
from .store import MEMORY, ChatStore, DatabaseLockedError, SchemaTooNewError, StoredMessage, export_markdown
from .widgets.chat_input import ChatInput
from .widgets.chat_view import ChatView, MessageBubble
from .widgets.compare_view import CompareView, lookahead_title
from .widgets.conversation_list import ConversationList
from .widgets.decoding_panel import DecodingPanel
from .widgets.speed_report import SpeedReportDialog
from .worker import EngineThread, GenerationRequest, LoadedModel, ReplyOutcome, StepUpdate

log = logging.getLogger(__name__)

NEW_CHAT_TITLE = "New chat"
TITLE_LENGTH = 40


@dataclass
class _Turn:
    """The reply being generated, from Send until the worker says it is over."""

    request_id: int
    conversation_id: int | None  # None: a new chat, created once the worker accepts the message
    user_text: str | None  # None when regenerating
    replace_from: int | None  # delete this message and the ones after it when accepted (edit, regenerate)
    system_prompt: str
    auto: bool
    started: bool = False
    text: str = ""
    stats: ReplyStats = field(default_factory=ReplyStats)
    bubble: MessageBubble | None = None


@dataclass(frozen=True)
class ReplyRecord:
    """A reply that has been saved: what the window emits in ``replyCompleted``."""

    conversation_id: int
    message_id: int | None  # None if nothing was saved (stopped before any text)
    text: str
    stats: ReplyStats
    outcome: ReplyOutcome


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
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else AppSettings.load()
        self._owns_store = store is None
        self.store_notice: str | None = None  # what went wrong opening the chat database, for the user
        self.store = store if store is not None else self._open_store()
        self.model: LoadedModel | None = None
        self._loading_path: str | None = None
        self._turn: _Turn | None = None
        self._next_request_id = 1
        self._conversation_id: int | None = None
        self._editing_message_id: int | None = None
        self._closed = False
        self._compare_plain_first = True  # flips after every comparison
        self._report_dialog: SpeedReportDialog | None = None
        self._report_request_id: int | None = None

        self.setWindowTitle("Lookahead Chat")
        icon = paths.resources_dir() / "icons" / "lookahead-chat.svg"
        if icon.is_file():
            self.setWindowIcon(QIcon(str(icon)))
        self._build_widgets()
        self._build_menus()
        self._build_status_bar()

        self.engine = EngineThread(self)
        w = self.engine.worker
        w.modelLoading.connect(self._on_model_loading)
        w.modelLoaded.connect(self._on_model_loaded)
        w.modelFailed.connect(self._on_model_failed)
        w.replyStarted.connect(self._on_reply_started)
        w.stepUpdate.connect(self._on_step_update)
        w.replyFinished.connect(self._on_reply_finished)
        w.replyFailed.connect(self._on_reply_failed)
        w.compareProgress.connect(self.compare_view.on_progress)
        w.compareFinished.connect(self._on_compare_finished)
        w.compareFailed.connect(self._on_compare_failed)
        w.reportProgress.connect(self._on_report_progress)
        w.reportFinished.connect(self._on_report_finished)

        self._steps = UpdateCoalescer(parent=self)  # one repaint per batch of steps, ~30 a second
        self._steps.flushed.connect(self._on_steps_flushed)
        self._settings_timer = QTimer(self)  # debounce: spin boxes change on every keystroke
        self._settings_timer.setSingleShot(True)
        self._settings_timer.setInterval(400)
        self._settings_timer.timeout.connect(self._save_settings)

        self.panel.load_settings(self.settings)
        self._restore_geometry()
        self._refresh_conversations(select_first=True)
        self._update_actions()
        if load_model:
            self.load_model(self.settings.model_path)
        if self.store_notice:
            QTimer.singleShot(0, self._show_store_notice)  # once the window is up

    def _open_store(self) -> ChatStore:
        """The chat database; a damaged one is replaced (with a backup), an unusable one by memory."""
        try:
            store = ChatStore()
        except (DatabaseLockedError, SchemaTooNewError, sqlite3.Error, OSError) as exc:
            log.warning("chat database unavailable: %s", exc)
            hint = (
                "Close the other program and restart Lookahead Chat to see your chats again."
                if isinstance(exc, DatabaseLockedError)
                else "The file was left as it is."
            )
            self.store_notice = (
                f"The chats cannot be opened: {exc}.\n\nYou can keep chatting, but this session's chats "
                f"will not be saved. {hint}"
            )
            return ChatStore(MEMORY)
        if store.recovered is not None:
            log.warning("chat database was corrupt; moved to %s", store.recovered.backup)
            self.store_notice = store.recovered.message()
        return store

    @Slot()
    def _show_store_notice(self) -> None:
        if self.store_notice and not self._closed:
            QMessageBox.warning(self, "Chat history", self.store_notice)

    # --- construction ---

    def _build_widgets(self) -> None:
        self.conversations = ConversationList()
        self.conversations.conversationSelected.connect(self._on_conversation_selected)
        self.conversations.newRequested.connect(self.new_chat)
        self.conversations.renamed.connect(self._on_conversation_renamed)
        self.conversations.deleteRequested.connect(self._on_delete_requested)

        self.chat_view = ChatView()
        self.chat_view.editRequested.connect(self.begin_edit)
        self.chat_view.regenerateRequested.connect(self.regenerate_last)

        self.edit_banner = QWidget()
        banner = QHBoxLayout(self.edit_banner)
        banner.setContentsMargins(0, 0, 0, 0)
        banner.addWidget(QLabel("Editing an earlier message: sending replaces it and everything after it."), 1)
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        banner.addWidget(self.cancel_edit_button)
        self.edit_banner.setVisible(False)

        self.input = ChatInput()
        self.input.submitted.connect(self.send_message)
        self.send_button = QPushButton("Send")
        self.send_button.setToolTip("Send (Enter / Ctrl+Enter)")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._on_send_clicked)
        input_row = QHBoxLayout()
        input_row.addWidget(self.input, 1)
        input_row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)

        centre = QWidget()
        centre_layout = QVBoxLayout(centre)
        centre_layout.setContentsMargins(0, 0, 0, 0)
        centre_layout.addWidget(self.chat_view, 1)
        centre_layout.addWidget(self.edit_banner)
        centre_layout.addLayout(input_row)

        self.compare_view = CompareView()
        self.compare_view.compareRequested.connect(self.start_comparison)
        self.compare_view.stopRequested.connect(self.stop_reply)
        self.compare_view.speedReportRequested.connect(self.open_speed_report)
        self.compare_view.busyChanged.connect(self._update_actions)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(centre, "Chat")
        self.tabs.addTab(self.compare_view, "Compare: plain vs lookahead")

        self.panel = DecodingPanel()
        self.panel.lookaheadChanged.connect(self._on_lookahead_changed)
        self.panel.settingsChanged.connect(self._on_settings_changed)
        self.panel.systemPromptEdited.connect(self._on_system_prompt_edited)
        self.panel.makeDefaultPromptRequested.connect(self._on_make_default_prompt)
        self.panel.reloadRequested.connect(self._on_reload_requested)
        panel_scroll = QScrollArea()
        panel_scroll.setWidget(self.panel)
        panel_scroll.setWidgetResizable(True)
        panel_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        panel_scroll.setMinimumWidth(330)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.conversations)
        self.splitter.addWidget(self.tabs)
        self.splitter.addWidget(panel_scroll)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
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
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.model_label)
        bar.addPermanentWidget(self.lookahead_label)

    # --- state ---

    def is_generating(self) -> bool:
        return self._turn is not None

    def is_loading(self) -> bool:
        return self._loading_path is not None

    def is_comparing(self) -> bool:
        return self.compare_view.is_measuring()

    def is_reporting(self) -> bool:
        return self._report_request_id is not None

    def is_busy(self) -> bool:
        """The engine is working for the chat, a comparison or a speed report."""
        return self.is_generating() or self.is_comparing() or self.is_reporting()

    def current_conversation_id(self) -> int | None:
        return self._conversation_id

    @Slot()
    def _update_actions(self) -> None:
        replying = self.is_generating()
        busy = self.is_busy()
        ready = self.model is not None and not self.is_loading()
        self.send_button.setText("Stop" if replying else "Send")
        self.send_button.setToolTip("Stop (Esc)" if replying else "Send (Enter / Ctrl+Enter)")
        self.send_button.setEnabled(replying or (ready and not busy))
        self.stop_action.setEnabled(busy)
        self.regenerate_action.setEnabled(ready and not busy and self._conversation_id is not None)
        self.open_action.setEnabled(not busy and not self.is_loading())
        self.recent_menu.setEnabled(not busy and not self.is_loading())
        self.export_action.setEnabled(self._conversation_id is not None)
        self.panel.reload_button.setEnabled(not busy and not self.is_loading())
        self.chat_view.set_busy(busy or not ready)
        self.compare_view.set_ready(ready and not busy)
        if self._report_dialog is not None:
            self._report_dialog.set_ready(ready and not busy)

    # --- model ---

    def load_model(self, path: str) -> None:
        """Load ``path`` ("" = the bundled model) on the worker; the current model stays until it succeeds."""
        if self.is_busy() or self.is_loading():
            return
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
        self.model_label.setToolTip(
            f"{model.gguf_name} ({model.architecture}, {model.n_params / 1e6:.0f}M parameters)\n"
            f"{model.path}\n{model.n_threads} threads, loaded in {model.load_s:.2f} s"
        )
        if model.lookahead_block_reason:
            self.lookahead_label.setText("lookahead unavailable")
            self.lookahead_label.setToolTip(model.lookahead_block_reason)
        else:
            self.lookahead_label.setText("lookahead available")
            self.lookahead_label.setToolTip("")
        self.panel.set_lookahead_blocked(model.lookahead_block_reason)
        self.statusBar().showMessage(f"Loaded {model.display_name} in {model.load_s:.2f} s", 5000)
        self._update_actions()
        self.modelChanged.emit(model)

    @Slot(str)
    def _on_model_failed(self, message: str) -> None:
        requested = self._loading_path
        self._loading_path = None
        self.progress.setVisible(False)
        self.statusBar().clearMessage()
        self._update_actions()
        if self._closed:
            return
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
        if select_first and self._conversation_id is None and convs:
            self._conversation_id = convs[0].id
        self.conversations.set_conversations(convs, self._conversation_id)
        if select_first:
            self._show_conversation(self._conversation_id)

    def _show_conversation(self, conversation_id: int | None) -> None:
        """Rebuild the chat view for ``conversation_id`` (None = a new, unsaved chat)."""
        self._conversation_id = conversation_id
        self.cancel_edit()
        if self._turn is not None:
            self._turn.bubble = None  # about to be deleted; re-created below if this chat is the one streaming
        self.chat_view.clear()
        conv = self.store.conversation(conversation_id) if conversation_id is not None else None
        if conv is None:
            self._conversation_id = None
            self.panel.set_system_prompt(self.settings.system_prompt)
            self.setWindowTitle("Lookahead Chat")
        else:
            self.panel.set_system_prompt(conv.system_prompt)
            self.setWindowTitle(f"{conv.title} — Lookahead Chat")
            for m in self.store.messages(conv.id):
                self._add_bubble(m)
        turn = self._turn
        if turn is not None and turn.started and turn.conversation_id == self._conversation_id:
            turn.bubble = self.chat_view.add_message("assistant", turn.text)
        self.chat_view.scroll_to_bottom()
        self._update_actions()

    def _add_bubble(self, m: StoredMessage) -> MessageBubble:
        stats = ReplyStats.from_json(m.stats_json)
        return self.chat_view.add_message(m.role, m.content, m.id, stats.summary_line() if stats else "")

    @Slot()
    def new_chat(self) -> None:
        """Start a new chat; it is saved once its first message is sent."""
        self._show_conversation(None)
        self.conversations.list.clearSelection()
        self.conversations.list.setCurrentItem(None)
        self.input.setFocus()

    @Slot(int)
    def _on_conversation_selected(self, conversation_id: int) -> None:
        if conversation_id != self._conversation_id:
            self._show_conversation(conversation_id)

    @Slot(int, str)
    def _on_conversation_renamed(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        if conversation_id == self._conversation_id:
            self.setWindowTitle(f"{title} — Lookahead Chat")

    @Slot(int)
    def _on_delete_requested(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{conv.title}” and all its messages?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        if self._turn is not None and self._turn.conversation_id == conversation_id:
            self.stop_reply()
            self._turn.conversation_id = None  # the partial reply has nowhere to go
        self.store.delete_conversation(conversation_id)
        if conversation_id == self._conversation_id:
            self._conversation_id = None
        self._refresh_conversations(select_first=True)

    @Slot(str)
    def _on_system_prompt_edited(self, text: str) -> None:
        if self._conversation_id is not None:
            self.store.set_system_prompt(self._conversation_id, text)

    @Slot(str)
    def _on_make_default_prompt(self, text: str) -> None:
        self.settings.system_prompt = text
        self._save_settings()
        self.statusBar().showMessage("New chats will start with this system prompt", 4000)

    @Slot()
    def _on_export(self) -> None:
        conv = self.store.conversation(self._conversation_id) if self._conversation_id is not None else None
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
        conv = self.store.conversation(self._conversation_id) if self._conversation_id is not None else None
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
    def _on_send_clicked(self) -> None:
        if self.is_generating():
            self.stop_reply()
        else:
            self.send_message()

    @Slot()
    def _on_send_shortcut(self) -> None:
        """Ctrl+Enter sends from the tab in view: the chat's input, or the comparison's."""
        if self.tabs.currentWidget() is self.compare_view:
            self.start_comparison(self.compare_view.input.toPlainText())
        else:
            self.send_message()

    @Slot()
    def send_message(self) -> None:
        """Send the input box's text. It stays in the box until the worker accepts it."""
        text = self.input.toPlainText().strip()
        if not text or self.is_busy():
            return
        if self.model is None or self.is_loading():
            self.statusBar().showMessage("Wait for the model to load before sending", 4000)
            return
        history, replaced = self._split_history(at=self._editing_message_id)
        self._start_turn(history, user_text=text, replaced=replaced)

    @Slot()
    def regenerate_last(self) -> None:
        """Generate the last reply again (replacing it)."""
        if self.is_busy() or self.model is None or self.is_loading() or self._conversation_id is None:
            return
        messages = self.store.messages(self._conversation_id)
        replaced: list[StoredMessage] = []
        while messages and messages[-1].role == "assistant":
            replaced.insert(0, messages.pop())
        if not messages:
            return
        self._start_turn(messages, user_text=None, replaced=replaced)

    @Slot(int)
    def begin_edit(self, message_id: int) -> None:
        """Put a user message back into the input; sending replaces it and what follows."""
        if self.is_generating() or self._conversation_id is None:
            return
        for m in self.store.messages(self._conversation_id):
            if m.id == message_id and m.role == "user":
                self._editing_message_id = message_id
                self.input.setPlainText(m.content)
                self.edit_banner.setVisible(True)
                self.input.setFocus()
                return

    @Slot()
    def cancel_edit(self) -> None:
        if self._editing_message_id is not None:
            self._editing_message_id = None
            self.edit_banner.setVisible(False)

    def _split_history(self, at: int | None) -> tuple[list[StoredMessage], list[StoredMessage]]:
        """The chat's messages before message ``at``, and ``at`` with those after it (``at`` None: all, none)."""
        if self._conversation_id is None:
            return [], []
        messages = self.store.messages(self._conversation_id)
        if at is None:
            return messages, []
        return [m for m in messages if m.id < at], [m for m in messages if m.id >= at]

    def _start_turn(self, history: list[StoredMessage], user_text: str | None, replaced: list[StoredMessage]) -> None:
        """Generate the next reply; ``replaced`` (an edited turn, a regenerated reply) goes once it is accepted."""
        system_prompt = self.panel.system_prompt().strip()
        messages = [Message("system", system_prompt)] if system_prompt else []
        messages += [Message(m.role, m.content) for m in history if m.role in ("user", "assistant")]
        if user_text is not None:
            messages.append(Message("user", user_text))
        lookahead = self.panel.lookahead_config()
        request = GenerationRequest(
            request_id=self._next_request_id,
            messages=tuple(messages),
            lookahead=lookahead,
            sampling=self.panel.sampling_config(),
            stop=self.panel.stop_config(),
            # A regenerated or re-asked reply often says much of what it replaces: free drafts.
            drafts_from=tuple(m.content for m in replaced),
        )
        self._next_request_id += 1
        self._turn = _Turn(
            request_id=request.request_id,
            conversation_id=self._conversation_id,
            user_text=user_text,
            replace_from=replaced[0].id if replaced else None,
            system_prompt=self.panel.system_prompt(),
            auto=lookahead is not None and lookahead.auto,
        )
        self._update_actions()
        self.engine.generateRequested.emit(request)

    @Slot()
    def stop_reply(self) -> None:
        """Stop the running reply (or comparison, or speed report) before its next step (Esc)."""
        if self.is_busy():
            self.engine.stopRequested.emit()
        elif self._editing_message_id is not None:
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

    def compare_lookahead_config(self) -> LookaheadConfig:
        """The decoding panel's Auto or W/N/G, used even while lookahead is switched off for the chat."""
        return self.panel.chosen_lookahead()

    def _context_messages(self, user_text: str) -> tuple[Message, ...]:
        system_prompt = self.panel.system_prompt().strip()
        messages = [Message("system", system_prompt)] if system_prompt else []
        return (*messages, Message("user", user_text))

    @Slot(str)
    def start_comparison(self, text: str) -> None:
        """Run ``text`` through plain and lookahead decoding (one after the other) and replay them."""
        text = text.strip()
        if not text or self.is_busy():
            return
        if self.model is None or self.is_loading():
            self.statusBar().showMessage("Wait for the model to load before comparing", 4000)
            return
        if self.model.lookahead_block_reason:
            QMessageBox.information(self, "Nothing to compare", self.model.lookahead_block_reason)
            return
        request = CompareRequest(
            request_id=self._next_request_id,
            messages=self._context_messages(text),
            lookahead=self.compare_lookahead_config(),
            sampling=self.panel.sampling_config(),
            stop=self.panel.stop_config(),
            plain_first=self._compare_plain_first,
        )
        self._next_request_id += 1
        self._compare_plain_first = not self._compare_plain_first
        self.compare_view.begin(request)  # emits busyChanged: the actions follow
        self.engine.compareRequested.emit(request)

    @Slot(object)
    def _on_compare_finished(self, result: object) -> None:
        if not self._closed:  # a result that arrives while closing has no one left to watch it
            self.compare_view.on_finished(result)

    @Slot(int, str)
    def _on_compare_failed(self, request_id: int, message: str) -> None:
        self.compare_view.on_failed(request_id, message)
        if not self._closed:
            QMessageBox.warning(self, "Could not compare", message)

    @Slot()
    def open_speed_report(self) -> SpeedReportDialog | None:
        """Show the speed report dialog (created on first use, kept with its results)."""
        if self._report_dialog is None:
            try:
                workloads = load_workloads()
            except (OSError, ValueError) as exc:
                QMessageBox.critical(self, "No benchmark prompts", str(exc))
                return None
            self._report_dialog = SpeedReportDialog(workloads, self)
            self._report_dialog.runRequested.connect(self.start_speed_report)
            self._report_dialog.cancelRequested.connect(self.stop_reply)
        self._report_dialog.set_settings_text(self._report_settings_text())
        self._update_actions()
        self._report_dialog.show()
        self._report_dialog.raise_()
        return self._report_dialog

    def _report_settings_text(self) -> str:
        sampling = self.panel.sampling_config()
        mode = "greedy" if sampling.greedy else f"temperature {sampling.temperature}, seed {sampling.seed}"
        return (
            f"{lookahead_title(self.compare_lookahead_config())} (from the decoding panel), "
            f"with this chat's system prompt and sampling ({mode})."
        )

    @Slot(list, int)
    def start_speed_report(self, workloads: list[Workload], max_tokens: int) -> None:
        dialog = self._report_dialog
        if dialog is None or not workloads or self.is_busy() or self.model is None or self.is_loading():
            return
        if self.model.lookahead_block_reason:
            QMessageBox.information(dialog, "Nothing to compare", self.model.lookahead_block_reason)
            return
        request = SpeedReportRequest(
            request_id=self._next_request_id,
            workloads=tuple(workloads),
            lookahead=self.compare_lookahead_config(),
            system_prompt=self.panel.system_prompt(),
            sampling=self.panel.sampling_config(),
            max_tokens=max_tokens,
        )
        self._next_request_id += 1
        self._report_request_id = request.request_id
        dialog.set_settings_text(self._report_settings_text())
        dialog.begin(request.request_id, len(workloads))
        self._update_actions()
        self.engine.speedReportRequested.emit(request)

    @Slot(object)
    def _on_report_progress(self, progress: object) -> None:
        if self._report_dialog is not None:
            self._report_dialog.on_progress(progress)

    @Slot(object)
    def _on_report_finished(self, outcome: SpeedReportOutcome) -> None:
        if outcome.request_id != self._report_request_id:
            return
        self._report_request_id = None
        if self._report_dialog is not None:
            self._report_dialog.on_finished(outcome)
        self._update_actions()

    # --- the worker's answers ---

    @Slot(int)
    def _on_reply_started(self, request_id: int) -> None:
        turn = self._turn
        if turn is None or turn.request_id != request_id:
            return
        turn.started = True
        if turn.conversation_id is None:
            title = (turn.user_text or NEW_CHAT_TITLE).splitlines()[0][:TITLE_LENGTH].strip() or NEW_CHAT_TITLE
            turn.conversation_id = self.store.create_conversation(title, turn.system_prompt).id
            self._conversation_id = turn.conversation_id
        if turn.replace_from is not None:
            self.store.delete_messages_from(turn.conversation_id, turn.replace_from)
        if turn.user_text is not None:
            self.store.add_message(turn.conversation_id, "user", turn.user_text)
            # Accepted: only now is the typed text safe to clear.
            self.input.clear()
            self.cancel_edit()
        self._refresh_conversations()
        self._show_conversation(turn.conversation_id)
        self.panel.live.reset()
        self._steps.clear()

    @Slot(object)
    def _on_step_update(self, update: StepUpdate) -> None:
        if self._turn is None or update.request_id != self._turn.request_id:
            return
        self._steps.push(update)
        self.replyStepReceived.emit(update)

    @Slot(list)
    def _on_steps_flushed(self, updates: list[StepUpdate]) -> None:
        """Draw a batch of steps at once: one Markdown render and one chart update."""
        turn = self._turn
        if turn is None or not updates:
            return
        new_steps = []
        for u in updates:
            turn.stats.observe(u.event, auto=turn.auto)
            turn.text += u.event.text
            if u.event.mode != "none":
                new_steps.append(u.event.n_committed)
        if turn.bubble is not None:
            turn.bubble.set_text(turn.text)
        self.panel.live.show_progress(turn.stats, new_steps, updates[-1].event)

    @Slot(object)
    def _on_reply_finished(self, outcome: ReplyOutcome) -> None:
        turn = self._turn
        if turn is None or outcome.request_id != turn.request_id:
            return
        self._steps.flush()
        self._turn = None
        turn.stats.model = self.model.display_name if self.model else ""
        if turn.stats.stop_reason is None:
            turn.stats.stop_reason = outcome.stop_reason
        message_id = None
        # A stopped reply is kept as far as it got; an empty stopped one is dropped.
        if turn.conversation_id is not None and (turn.text or outcome.stop_reason != "cancelled"):
            message_id = self.store.add_message(
                turn.conversation_id, "assistant", turn.text, turn.stats.to_json()
            ).id
        if turn.bubble is not None:
            if message_id is None:
                self._show_conversation(self._conversation_id)
            else:
                turn.bubble.message_id = message_id
                turn.bubble.set_stats_line(turn.stats.summary_line())
        self._update_actions()
        if outcome.error and not self._closed:
            QMessageBox.warning(self, "The reply failed", outcome.error)
        self.replyCompleted.emit(ReplyRecord(turn.conversation_id or 0, message_id, turn.text, turn.stats, outcome))

    @Slot(int, str)
    def _on_reply_failed(self, request_id: int, message: str) -> None:
        turn = self._turn
        if turn is None or turn.request_id != request_id:
            return
        self._turn = None
        self._steps.clear()
        self._update_actions()
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
        if self._turn is not None and self._turn.started:
            self._on_reply_finished(ReplyOutcome(self._turn.request_id, "cancelled", self._turn.stats.n_tokens, 0))
        self._steps.clear()
        self.compare_view.shutdown()
        if self._report_dialog is not None:
            self._report_dialog.close()
        self._save_settings()
        if self._owns_store:
            self.store.close()
        log.info("closed in %.2f s", time.perf_counter() - t0)
        event.accept()
