"""The main window: chats on the left, the conversation in the middle, decoding on the right.

The window assembles the parts and wires their signals. The chat's logic (turns,
request ids, what is saved) is ``ChatController``'s, and ``ChatRunner`` draws a
turn as the worker's steps arrive; comparisons and speed reports are
``Comparisons'``; measuring this PC at idle is ``MeasureStatus``'s. The menu bar
is laid out by ``menus.build_menu_bar`` from the slots the window hands it, and
what Help opens is ``Help``'s; choosing a model is ``ModelDialogs'``
(app/model_loader.py); the local server's status is ``ServingStatus'``; the
side panels' showing and hiding is ``SidePanels'``; the window's size and place
between runs are ``window_geometry``'s. Nothing here calls the engine: requests
go to the ``EngineWorker`` through ``EngineThread``'s signals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QCloseEvent, QIcon, QResizeEvent
from PySide6.QtWidgets import QMainWindow, QScrollArea, QSplitter, QTabWidget, QVBoxLayout, QWidget

from engine.library.names import DRAFTS_ONLY_NOTE, LookaheadKind

from . import paths
from .chat_controller import ChatController, ReplyRecord, RequestIds
from .chat_runner import ChatRunner
from .engine_thread import EngineThread
from .help import Help
from .menus import MenuActions, MenuBar, MenuParts, build_menu_bar
from .model_loader import ModelDialogs, ModelLoader, load_options
from .requests import LoadedModel
from .serving import ServerController
from .serving_status import ServingStatus
from .settings import AppSettings
from .store import ChatStore, Conversation, open_chat_store
from .wheel_guard import install_wheel_guard
from .widgets import plain
from .widgets.chat_pane import ChatPane
from .widgets.compare_view import CompareView
from .widgets.comparison_routing import Comparisons
from .widgets.conversation_list import ConversationList
from .widgets.decoding_panel import DecodingPanel
from .widgets.library import LibraryDialog
from .widgets.measure_status import MeasureStatus
from .widgets.serve_dialog import ServeDialog
from .widgets.side_panels import DEFAULT_SPLITTER_SIZES, SidePanels
from .window_geometry import DEFAULT_SIZE, restore_geometry, save_geometry

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
        self.model_dialogs = ModelDialogs(self.models, self.settings, self, load_model=self.load_model,
                                          busy=self.is_busy, save_settings=self._save_settings)
        self.recent_menu = self.model_dialogs.recent_menu
        self.help = Help(self, model=lambda: self.model)
        # The chats list and the panel beside the chat: the View menu and the tabs' corners show and hide them.
        self.side_panels = SidePanels(
            self, self.splitter, self.conversations, self.tabs, self.panel_scroll,
            show_chats=self.settings.show_chat_list, show_panel=self.settings.show_decoding_panel,
            chosen=self._on_side_panel_chosen,
        )
        self.menus = self._build_menus()
        self._on_show_lookahead(self.settings.show_lookahead)
        self._wire()

        self.panel.load_settings(self.settings)
        restore_geometry(self, self.splitter, self.settings)
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

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.models = ModelLoader(self.engine, self)
        self.model_label, self.lookahead_label, self.progress = (
            self.models.model_label, self.models.lookahead_label, self.models.progress)
        self.measure_status = MeasureStatus(self.engine, can_run=lambda: self.is_ready() and not self.is_busy())
        self.serving_status = ServingStatus(self.serving, self, settings_changed=self._on_settings_changed)
        self.serving_label = self.serving_status.serving_label
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
        self.runner.status.connect(lambda text: self.statusBar().showMessage(text, 5000))
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
        self.runner.requestSent.connect(self.serving_status.say_if_a_program_goes_first)

        self._settings_timer = QTimer(self)  # debounce: spin boxes change on every keystroke
        self._settings_timer.setSingleShot(True)
        self._settings_timer.setInterval(400)
        self._settings_timer.timeout.connect(self._save_settings)

    def _build_menus(self) -> MenuBar:
        """The menu bar, its items calling the window's slots and its parts'."""
        runner = self.runner
        return build_menu_bar(self, MenuActions(
            open_model=self.model_dialogs.open_model, export_markdown=runner.backup.export_chat_as_markdown,
            quit=self.close, show_compare_tab=self.show_compare_tab,
            open_speed_report=self.comparisons.open_speed_report, new_chat=self.new_chat, stop=self.stop_reply,
            regenerate=self.regenerate_last, open_library=self.model_dialogs.open_library,
            show_chat_template=self.model_dialogs.show_chat_template, serve=self.show_serve_dialog,
            send=self._on_send_shortcut, show_lookahead=self._on_show_lookahead,
            show_shortcuts=self.help.show_shortcuts, open_log_folder=self.help.open_log_folder,
            show_about=self.help.show_about,
        ), MenuParts(
            recent_models=self.recent_menu,
            backup=(runner.export_json_action, runner.export_all_json_action, runner.import_json_action),
            search=(runner.find_action, runner.search_action),
            side_panels=(self.side_panels.chat_list_action, self.side_panels.panel_action),
            lookahead_shown=self.settings.show_lookahead,
        ))

    # --- side panels and lookahead tints ---

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

    @Slot(bool)
    def _on_show_lookahead(self, on: bool) -> None:
        self.chat_pane.set_show_lookahead(on)
        self.compare_view.set_show_lookahead(on)
        if on != self.settings.show_lookahead:
            self.settings.show_lookahead = on
            self._save_settings()

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

    def is_busy(self) -> bool:
        """The engine is working for the chat, a comparison or a speed report."""
        return self.is_generating() or self.comparisons.is_comparing() or self.comparisons.is_reporting()

    def current_conversation_id(self) -> int | None:
        return self.chat.conversation_id

    @Slot()
    def _update_actions(self) -> None:
        busy, ready = self.is_busy(), self.is_ready()
        self.chat_pane.set_state(self.is_generating(), can_send=ready and not busy, busy=busy or not ready)
        menus = self.menus
        menus.stop_action.setEnabled(busy)
        menus.regenerate_action.setEnabled(ready and not busy and self.chat.conversation_id is not None)
        for widget in (menus.open_action, self.recent_menu, self.panel.reload_button):
            widget.setEnabled(not busy and not self.is_loading())
        menus.export_action.setEnabled(self.chat.conversation_id is not None)
        menus.template_action.setEnabled(self.model is not None)
        self.comparisons.set_ready(ready and not busy)

    # --- model ---

    @property
    def model(self) -> LoadedModel | None:
        """The model in use (None before the first load succeeds)."""
        return self.models.model

    @property
    def library_dialog(self) -> LibraryDialog | None:
        """Model → Library…'s dialog while it is open."""
        return self.model_dialogs.library_dialog

    def load_model(self, path: str) -> None:
        """Load ``path`` ("" = the bundled model) on the worker; the current model stays until it succeeds."""
        if self.is_busy() or self.is_loading():
            return
        self.measure_status.new_model()
        n_ctx, threads = self.panel.n_ctx_spin.value(), self.panel.threads_spin.value()
        n_ctx, threads = load_options(path, self.model, self.settings, n_ctx, threads)
        self.serving.model_changing()
        self.models.load(path, n_ctx, threads)

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
            model.lookahead_block_reason, DRAFTS_ONLY_NOTE if model.lookahead_kind == LookaheadKind.DRAFTS_ONLY else "")
        self.chat_pane.context_meter.set_context(model.n_ctx)
        self._update_actions()
        # Earlier chats with this model, for lookahead to draft from (tokenized on the engine's thread).
        names = {model.display_name, Path(model.path).stem}  # the file's name: what chats were stored under before
        self.engine.rememberRequested.emit(model.path, self.store.search.chat_texts(names))
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
    def show_serve_dialog(self) -> ServeDialog:
        """Model → Serve to other programs…: one dialog, raised when open."""
        return self.serving_status.show_serve_dialog()

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

    def export_chat(self, path: Path) -> None:
        """Write the open chat as Markdown to ``path``."""
        self.runner.backup.export_chat(path)

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
        state = self.side_panels.splitter_state()  # as the user arranged it, not as a narrow window narrowed it
        save_geometry(self, state, self.settings)
        try:
            self.settings.save()
        except OSError as exc:
            log.warning("could not save settings: %s", exc)

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
