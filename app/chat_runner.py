"""The chat's Qt side: sends the controller's requests to the worker and draws the worker's answers in the pane.

``ChatController`` decides (what a turn is, what is saved); ``ChatPane`` shows;
this object connects them to the engine's worker and to the decoding panel's
live statistics. Step events are buffered and drawn by a ~30 Hz timer, so a
fast model cannot flood the event loop with repaints.

It also owns what the window does with the chats as a whole: the search
dialog, forking, flipping between a message's alternatives, and the chats
written to files (``BackupActions``, app/backup_actions.py: Markdown and the
JSON backup). Their actions are here; the window puts them in its menus.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QWidget

from engine.costs.contention import busy_notice
from engine.decoding.prompt_cache import PREFILL_CHUNK

from .backup_actions import BackupActions
from .chat_controller import ChatController, TurnSettings
from .coalescer import UpdateCoalescer
from .engine_thread import EngineThread
from .requests import DocumentsPlaced, GenerationRequest, ReplyOutcome, StepUpdate
from .stats import ReplyStats
from .store import Conversation, SearchHit, StoredMessage
from .widgets import plain
from .widgets.chat_pane import WAITING_LINE, ChatPane
from .widgets.conversation_list import ConversationList
from .widgets.decoding_panel import DecodingPanel
from .widgets.message_bubble import MessageBubble
from .widgets.search import MAX_RESULTS, SearchDialog

READING_NOTICE = "The attached files are still being read: send once they are ready (the message is kept)"


class ChatRunner(QObject):
    """Runs the open chat's turns between the pane, the controller and the worker.

    ``can_start()`` is the one "is a model ready and the engine free" check before
    a turn (it may tell the user why not); ``model_name()`` labels saved replies.

    Signals:
        conversationShown(object): the ``Conversation`` now in view (None: a new, unsaved chat).
        turnStarted(): the worker took a message; the chat (maybe new) is saved.
        stepReceived(object): every ``StepUpdate`` as it arrives, before coalescing.
        completed(object): a ``ReplyRecord`` once a reply is over and saved.
        rejected(str): the worker refused a message (dialog shown, the text back in the box).
        busyChanged(): a turn started or ended.
        requestSent(): a request went to the worker (a measurement at idle must pause).
        turnEnded(): the engine is free again after a turn.
        stopRequested(): the chat a reply was streaming into was deleted: stop it.
        status(str): a short note for the status bar (exported, imported, forked).
    """

    conversationShown = Signal(object)
    turnStarted = Signal()
    stepReceived = Signal(object)
    completed = Signal(object)
    rejected = Signal(str)
    busyChanged = Signal()
    requestSent = Signal()
    turnEnded = Signal()
    stopRequested = Signal()
    status = Signal(str)

    def __init__(
        self,
        controller: ChatController,
        pane: ChatPane,
        conversations: ConversationList,
        panel: DecodingPanel,
        engine: EngineThread,
        can_start: Callable[[], bool],
        model_name: Callable[[], str],
        dialog_parent: QWidget,
    ) -> None:
        super().__init__(dialog_parent)
        self.chat = controller
        self._pane = pane
        self._list = conversations
        self._panel = panel
        self._engine = engine
        self._can_start = can_start
        self._model_name = model_name
        self._parent = dialog_parent
        self._reply_bubble: MessageBubble | None = None  # where the streaming reply is drawn, if in view
        self._settings_of: int | None = None  # the chat whose saved sampling values the panel was given
        self.closed = False
        self._threads_reduced = False  # the last step ran with fewer threads (said once in the status bar)
        self._steps = UpdateCoalescer(parent=self)  # one repaint per batch of steps, ~30 a second
        self._steps.flushed.connect(self._on_steps_flushed)
        conversations.conversationSelected.connect(self._on_conversation_selected)
        conversations.newRequested.connect(self.new_chat)
        conversations.renamed.connect(self._on_conversation_renamed)
        conversations.deleteRequested.connect(self._on_delete_requested)
        pane.sendRequested.connect(self.send_message)
        pane.editRequested.connect(self.begin_edit)
        pane.regenerateRequested.connect(self.regenerate_last)
        pane.writeOutRequested.connect(self.write_out_last)
        pane.cancelEditRequested.connect(self.cancel_edit)
        pane.alternativeRequested.connect(self.show_alternative)
        pane.forkRequested.connect(self.fork)
        panel.lookaheadChanged.connect(self._on_lookahead_changed)
        w = engine.worker
        w.replyStarted.connect(self._on_reply_started)
        w.documentsPlaced.connect(self._on_documents_placed)
        w.stepUpdate.connect(self._on_step_update)
        w.promptProgress.connect(self._on_prompt_progress)
        w.replyFinished.connect(self._on_reply_finished)
        w.replyFailed.connect(self._on_reply_failed)
        self.search_dialog: SearchDialog | None = None  # made when first opened
        self._build_actions()
        self.busyChanged.connect(self._update_actions)
        self.conversationShown.connect(self._update_actions)
        # While the user writes, the worker reads what the next prompt begins with (the chat, the files).
        self.conversationShown.connect(self.want_read_ahead)
        self.turnEnded.connect(self.want_read_ahead)
        pane.attachmentsChanged.connect(self.want_read_ahead)

    def _build_actions(self) -> None:
        def action(text: str, slot: Callable[[], object], shortcut: str | None = None) -> QAction:
            a = QAction(text, self._parent)
            if shortcut is not None:
                a.setShortcut(QKeySequence(shortcut))
            a.triggered.connect(slot)
            return a

        self.find_action = action("&Find in chat…", lambda: self.open_search(this_chat_only=True), "Ctrl+F")
        self.search_action = action("Search &all chats…", lambda: self.open_search(this_chat_only=False),
                                    "Ctrl+Shift+F")
        self.backup = BackupActions(self.chat, self._parent)
        self.backup.imported.connect(self.refresh_conversations)
        self.backup.status.connect(self.status)
        self.export_json_action, self.export_all_json_action, self.import_json_action = (
            self.backup.export_json_action, self.backup.export_all_json_action, self.backup.import_json_action)

    @Slot()
    def _update_actions(self) -> None:
        """Searching (it opens chats at a message) waits while a reply streams; exporting needs a saved chat."""
        free = not self.chat.is_generating()
        self.find_action.setEnabled(free and self.chat.conversation_id is not None)
        self.search_action.setEnabled(free)
        self.export_json_action.setEnabled(self.chat.conversation_id is not None)
        if self.search_dialog is not None:
            self.search_dialog.setEnabled(free)
            self.search_dialog.set_conversation(self.chat.conversation_id)

    # --- the chats ---

    def refresh_conversations(self, select_first: bool = False) -> None:
        """Refill the chat list; ``select_first`` opens the newest chat when none is open."""
        convs = self.chat.store.conversations()
        if select_first and self.chat.conversation_id is None and convs:
            self.chat.conversation_id = convs[0].id
        self._list.set_conversations(convs, self.chat.conversation_id)
        if select_first:
            self.show_conversation(self.chat.conversation_id)

    @Slot()
    def new_chat(self) -> None:
        """Start a new chat; it is saved once its first message is sent."""
        self.show_conversation(None)
        self._list.list.clearSelection()
        self._list.list.setCurrentRow(-1)
        self._pane.input.setFocus()

    @Slot(int)
    def _on_conversation_selected(self, conversation_id: int) -> None:
        if conversation_id != self.chat.conversation_id:
            self.show_conversation(conversation_id)

    @Slot(int, str)
    def _on_conversation_renamed(self, conversation_id: int, title: str) -> None:
        self.chat.rename_conversation(conversation_id, title)
        if conversation_id == self.chat.conversation_id:
            self.conversationShown.emit(self.chat.store.conversation(conversation_id))

    @Slot(int)
    def _on_delete_requested(self, conversation_id: int) -> None:
        conv = self.chat.store.conversation(conversation_id)
        if conv is None:
            return
        question = f"Delete “{conv.title}” and all its messages?"
        yes_no = plain.Button.Yes | plain.Button.No
        if plain.ask(self._parent, plain.Icon.Question, "Delete chat", question, yes_no) != plain.Button.Yes:
            return
        if self.chat.delete_conversation(conversation_id):
            self.stopRequested.emit()
        self.refresh_conversations(select_first=True)


    def show_conversation(self, conversation_id: int | None, keep_edit: bool = False) -> None:
        """Rebuild the pane for ``conversation_id`` (None = a new, unsaved chat); a reply streaming into it goes on."""
        self.chat.conversation_id = conversation_id
        if not keep_edit:
            self.cancel_edit()
        conv: Conversation | None = None
        if conversation_id is not None:
            conv = self.chat.store.conversation(conversation_id)
        if conv is None:
            self.chat.conversation_id = None
        elif conv.id != self._settings_of:  # opened, not redrawn: its own values (a new chat keeps the panel's)
            self._panel.load_chat_settings(self.chat.store.conversation_settings(conv.id))
        self._settings_of = conv.id if conv is not None else None
        messages = self.chat.messages()
        self._pane.show_messages(messages, self.chat.alternatives())  # with each message's files and sources
        self._label_live_stats(messages)
        turn = self.chat.turns.turn
        self._reply_bubble = None
        if turn is not None and turn.started and turn.conversation_id == self.chat.conversation_id:
            self._reply_bubble = self._pane.add_reply_bubble(turn.text)
            if turn.text:
                self._reply_bubble.set_text(turn.text, turn.marks)
            if turn.sources is not None:
                self._reply_bubble.set_sources(turn.sources)
        self._pane.chat_view.scroll_to_bottom()
        self.conversationShown.emit(conv)

    def _label_live_stats(self, messages: list[StoredMessage] | None = None) -> None:
        """Make the panel's statistics belong to the chat in view, or say whose they are.

        A running reply keeps drawing there wherever the user looks, under a caption naming
        its chat; otherwise the panel shows the last reply of the branch in view, as saved.
        """
        live = self._panel.live
        turn = self.chat.turns.turn
        if turn is not None and turn.started:
            if turn.conversation_id == self.chat.conversation_id:
                live.set_caption("Writing a reply in this chat")
            else:
                live.set_caption(f"Writing a reply in {self._title_of(turn.conversation_id)}, not the chat shown")
            return
        if messages is None:
            messages = self.chat.messages()
        replies = [m for m in messages if m.role == "assistant"]
        stats = ReplyStats.from_stats_json(replies[-1].stats_json) if replies else None
        if stats is None:
            live.reset("No reply in this chat yet" if not replies else "No statistics kept for this chat's last reply")
        else:
            live.show_saved(stats, "Last reply of this chat")

    def _title_of(self, conversation_id: int | None) -> str:
        conv = self.chat.store.conversation(conversation_id) if conversation_id is not None else None
        return f"“{conv.title}”" if conv is not None else "a deleted chat"

    @Slot(int)
    def show_alternative(self, message_id: int) -> None:
        """‹ or › on a message: the chat now shows (and goes on from) that alternative."""
        if self.chat.show_alternative(message_id):
            self.show_conversation(self.chat.conversation_id)
            self._pane.chat_view.scroll_to_message(message_id, flash=False)

    @Slot(int)
    def fork(self, message_id: int) -> None:
        """"Fork" on a message: a new chat with the conversation down to it, opened."""
        conv = self.chat.fork(message_id)
        if conv is not None:
            self.refresh_conversations()
            self.show_conversation(conv.id)
            self.status.emit(f"Forked into “{conv.title}”")

    # --- search ---

    def open_search(self, this_chat_only: bool) -> SearchDialog:
        """Ctrl+F (the open chat) or Ctrl+Shift+F (all chats): the search dialog, with the box focused."""
        if self.search_dialog is None:
            self.search_dialog = SearchDialog(self._search, self._parent)
            self.search_dialog.resultActivated.connect(self.open_message)
        self.search_dialog.start(this_chat_only, self.chat.conversation_id)
        self._update_actions()
        return self.search_dialog

    def _search(self, text: str, conversation_id: int | None) -> list[SearchHit]:
        return self.chat.store.search.find(text, MAX_RESULTS, conversation_id)

    @Slot(int, int)
    def open_message(self, conversation_id: int, message_id: int) -> None:
        """A search result: open its chat on the message's branch, and bring the message into view."""
        if not self.chat.open_message(conversation_id, message_id):
            return
        self.refresh_conversations()
        self.show_conversation(conversation_id)
        self._pane.chat_view.scroll_to_message(message_id)

    # --- starting turns ---

    def _settings(self) -> TurnSettings:
        return TurnSettings(
            system_prompt=self._panel.system_prompt(),
            lookahead=self._panel.lookahead_config(),
            sampling=self._panel.sampling_config(),
            stop=self._panel.stop_config(),
            chat_settings=self._panel.chat_settings(),
        )

    @Slot()
    def send_message(self) -> None:
        """Send the input box's text and the files attached to it: shown at once, and left in the box (the text
        given back) if the worker refuses them. The files leave the box once the message is saved."""
        text, typed = self._pane.take_input()
        # The message would go without the files still being read.
        if self._pane.is_reading_attachments():
            self.status.emit(READING_NOTICE)
            return
        attachments = self._pane.pending_attachments()
        if (not text and not attachments) or not self._can_start():
            return
        turn, request = self.chat.turns.begin_send(text, typed, self._settings(), attachments)
        self._pane.input.clear()
        self._pane.show_pending(turn.history, text, attachments)
        self._send(request)

    @Slot()
    def regenerate_last(self) -> None:
        """Generate the last reply again (the one it replaces stays, as an alternative)."""
        self._regenerate(self._settings())

    @Slot()
    def write_out_last(self) -> None:
        """The last reply, stopped for repeating itself, written again without the loop guard this once: the same
        text up to where it stopped (the same settings; drafted from the stopped reply, so that part comes fast),
        then on to its end."""
        settings = self._settings()
        self._regenerate(replace(settings, stop=replace(settings.stop, loop_guard=False)))

    def _regenerate(self, settings: TurnSettings) -> None:
        if self.chat.conversation_id is None or not self._can_start():
            return
        started = self.chat.turns.begin_regenerate(settings)
        if started is not None:
            self._send(started[1])

    def _send(self, request: GenerationRequest) -> None:
        self.requestSent.emit()
        self.busyChanged.emit()
        self._engine.generateRequested.emit(request)

    @Slot()
    def want_read_ahead(self) -> None:
        """Tell the worker what the next message's prompt begins with, to read while the user writes it."""
        if self.closed or self.chat.is_generating():
            return  # the reply reads its own prompt; its end asks again
        self._engine.readAheadRequested.emit(
            self.chat.turns.read_ahead_request(self._settings(), self._pane.pending_attachments())
        )

    @Slot(int)
    def begin_edit(self, message_id: int) -> None:
        """Put a user message back into the input, with its files; sending adds the new one beside it."""
        text = self.chat.start_edit(message_id)
        self._pane.set_editing(text)
        if text is not None:
            self._pane.set_attachments(self.chat.attachments_of(message_id))
        self.want_read_ahead()

    @Slot()
    def cancel_edit(self) -> None:
        if self.chat.cancel_edit():
            self._pane.set_editing(None)
            self.want_read_ahead()

    @Slot(object)
    def _on_lookahead_changed(self, config: object) -> None:
        if self.chat.is_generating():
            self._engine.lookaheadChanged.emit(config)  # takes effect at the next step

    # --- the worker's answers ---

    @Slot(int)
    def _on_reply_started(self, request_id: int) -> None:
        turn = self.chat.turns.accept(request_id)
        if turn is None:
            return
        if turn.user_text is not None:
            self._pane.set_editing(None)
            if turn.attachments:
                self._pane.clear_attachments()  # saved with the message now
        self.turnStarted.emit()
        self._steps.clear()
        self._panel.live.reset()  # before the chat is shown: that labels the new reply's numbers
        self.refresh_conversations()
        self.show_conversation(turn.conversation_id)

    @Slot(object)
    def _on_documents_placed(self, placed: DocumentsPlaced) -> None:
        """What of the files the reply is given: saved on the message, shown on its chips and under the reply."""
        turn = self.chat.turns.place_documents(placed)
        if turn is None or turn.conversation_id != self.chat.conversation_id or turn.reply_parent is None:
            return
        meter = self._pane.context_meter
        meter.set_documents({**meter.documents, **placed.sources.coverage})
        bubble = self._pane.chat_view.bubble_for(turn.reply_parent)
        message = self.chat.store.message(turn.reply_parent)
        if bubble is not None and message is not None:
            bubble.set_attachments(message.attachments, placed.sources.coverage)
        if self._reply_bubble is not None:
            self._reply_bubble.set_sources(turn.sources)

    @Slot(int, int, int)
    def _on_prompt_progress(self, request_id: int, done: int, total: int) -> None:
        """Before the first token: how much of a long prompt has been read."""
        turn = self.chat.turns.current(request_id)
        if turn is not None and not turn.text and self._reply_bubble is not None and total > PREFILL_CHUNK:
            self._reply_bubble.set_stats_line(f"{WAITING_LINE} {done} / {total} tokens")

    @Slot(object)
    def _on_step_update(self, update: StepUpdate) -> None:
        if self.chat.turns.note_step(update.request_id, update.event) is None:
            return
        self._steps.push(update)
        self.stepReceived.emit(update)

    @Slot(list)
    def _on_steps_flushed(self, updates: list[StepUpdate]) -> None:
        """Draw a batch of steps at once: one Markdown render and one chart update."""
        turn = self.chat.turns.turn
        if turn is None or not updates:
            return
        new_steps = self.chat.turns.observe([u.event for u in updates])
        self._pane.show_usage(turn.stats)
        view = self._pane.chat_view
        if self._reply_bubble is not None and turn.stats.dropped_messages != len(view.left_out()):
            # The oldest messages of the history this reply follows no longer fit the context.
            view.mark_left_out(turn.stats.dropped_messages)
        bubble = self._reply_bubble
        if bubble is not None:
            bubble.set_text(turn.text, turn.marks)
            if turn.text and bubble.stats_label.text():
                bubble.set_stats_line("")
        last = updates[-1].event
        self._panel.live.show_progress(turn.stats, new_steps, last)
        steps = [u.event for u in updates if u.event.mode != "none"]
        if steps:
            self._panel.show_step(steps[-1])
        if last.reduced and not self._threads_reduced:
            self.status.emit(busy_notice(last.kept_threads, last.max_threads))
        self._threads_reduced = last.reduced

    @Slot(object)
    def _on_reply_finished(self, outcome: ReplyOutcome) -> None:
        if self.chat.turns.current(outcome.request_id) is None:
            return
        self._steps.flush()
        finished = self.chat.turns.finish(outcome, self._model_name())
        assert finished is not None
        turn, record = finished
        bubble, self._reply_bubble = self._reply_bubble, None
        if bubble is not None:
            if record.message_id is None:
                self.show_conversation(self.chat.conversation_id)
            else:
                bubble.set_message_id(record.message_id, self.chat.store.siblings(record.message_id))
                bubble.set_stats_line(record.stats.summary_line())
                self._pane.chat_view.set_last_stopped_looping(record.stats.stop_reason == "loop")
        if record.message_id is None:
            if bubble is None:  # nothing kept: the panel goes back to the chat in view (shown above otherwise)
                self._label_live_stats()
        elif turn.conversation_id == self.chat.conversation_id:
            self._panel.live.set_caption("Last reply of this chat")
        else:
            self._panel.live.set_caption(f"Last reply, in {self._title_of(turn.conversation_id)}: not the chat shown")
        self.busyChanged.emit()
        self.turnEnded.emit()
        if outcome.error and not self.closed:
            plain.show_message(self._parent, plain.Icon.Warning, "The reply failed", outcome.error)
        self.completed.emit(record)

    @Slot(int, str)
    def _on_reply_failed(self, request_id: int, message: str) -> None:
        turn = self.chat.turns.reject(request_id)
        if turn is None:
            return
        self._steps.clear()
        if turn.user_text is not None:
            # Nothing was saved: show the chat as it is, and give the typed text back.
            self._pane.give_back(turn.typed)
            self.show_conversation(self.chat.conversation_id, keep_edit=True)
        self.busyChanged.emit()
        self.turnEnded.emit()
        if not self.closed:
            plain.show_message(self._parent, plain.Icon.Warning, "Could not send", message)
        self.rejected.emit(message)

    def close_turn(self) -> None:
        """The window is closing: save a reply the closing stopped, as far as it got."""
        self.closed = True
        turn = self.chat.turns.turn
        if turn is not None and turn.started:
            self._on_reply_finished(ReplyOutcome(turn.request_id, "cancelled", turn.stats.n_tokens, 0))
        self._steps.clear()
