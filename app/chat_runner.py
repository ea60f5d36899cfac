"""The chat's Qt side: sends the controller's requests to the worker and draws the worker's answers in the pane.

``ChatController`` decides (what a turn is, what is saved); ``ChatPane`` shows;
this object connects them to the engine's worker and to the decoding panel's
live statistics. Step events are buffered and drawn by a ~30 Hz timer, so a
fast model cannot flood the event loop with repaints.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from .chat_controller import ChatController, TurnSettings
from .coalescer import UpdateCoalescer
from .requests import GenerationRequest, ReplyOutcome, StepUpdate
from .store import Conversation
from .widgets.chat_pane import ChatPane
from .widgets.chat_view import MessageBubble
from .widgets.conversation_list import ConversationList
from .widgets.decoding_panel import DecodingPanel
from .worker import EngineThread


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
        self.closed = False
        self._steps = UpdateCoalescer(parent=self)  # one repaint per batch of steps, ~30 a second
        self._steps.flushed.connect(self._on_steps_flushed)
        conversations.conversationSelected.connect(self._on_conversation_selected)
        conversations.newRequested.connect(self.new_chat)
        conversations.renamed.connect(self._on_conversation_renamed)
        conversations.deleteRequested.connect(self._on_delete_requested)
        pane.sendRequested.connect(self.send_message)
        pane.editRequested.connect(self.begin_edit)
        pane.regenerateRequested.connect(self.regenerate_last)
        pane.cancelEditRequested.connect(self.cancel_edit)
        panel.lookaheadChanged.connect(self._on_lookahead_changed)
        w = engine.worker
        w.replyStarted.connect(self._on_reply_started)
        w.stepUpdate.connect(self._on_step_update)
        w.replyFinished.connect(self._on_reply_finished)
        w.replyFailed.connect(self._on_reply_failed)

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
        answer = QMessageBox.question(self._parent, "Delete chat", f"Delete “{conv.title}” and all its messages?")
        if answer != QMessageBox.StandardButton.Yes:
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
        self._pane.show_messages(self.chat.messages())
        turn = self.chat.turn
        self._reply_bubble = None
        if turn is not None and turn.started and turn.conversation_id == self.chat.conversation_id:
            self._reply_bubble = self._pane.add_reply_bubble(turn.text)
            if turn.text:
                self._reply_bubble.set_text(turn.text, turn.marks)
        self._pane.chat_view.scroll_to_bottom()
        self.conversationShown.emit(conv)

    # --- starting turns ---

    def _settings(self) -> TurnSettings:
        return TurnSettings(
            system_prompt=self._panel.system_prompt(),
            lookahead=self._panel.lookahead_config(),
            sampling=self._panel.sampling_config(),
            stop=self._panel.stop_config(),
        )

    @Slot()
    def send_message(self) -> None:
        """Send the input box's text: shown at once, and given back to the box if the worker refuses it."""
        text, typed = self._pane.take_input()
        if not text or not self._can_start():
            return
        turn, request = self.chat.begin_send(text, typed, self._settings())
        self._pane.input.clear()
        self._pane.show_pending(turn.history, text)
        self._send(request)

    @Slot()
    def regenerate_last(self) -> None:
        """Generate the last reply again (replacing it)."""
        if self.chat.conversation_id is None or not self._can_start():
            return
        started = self.chat.begin_regenerate(self._settings())
        if started is not None:
            self._send(started[1])

    def _send(self, request: GenerationRequest) -> None:
        self.requestSent.emit()
        self.busyChanged.emit()
        self._engine.generateRequested.emit(request)

    @Slot(int)
    def begin_edit(self, message_id: int) -> None:
        """Put a user message back into the input; sending replaces it and what follows."""
        self._pane.set_editing(self.chat.start_edit(message_id))

    @Slot()
    def cancel_edit(self) -> None:
        if self.chat.cancel_edit():
            self._pane.set_editing(None)

    @Slot(object)
    def _on_lookahead_changed(self, config: object) -> None:
        if self.chat.is_generating():
            self._engine.lookaheadChanged.emit(config)  # takes effect at the next step

    # --- the worker's answers ---

    @Slot(int)
    def _on_reply_started(self, request_id: int) -> None:
        turn = self.chat.accept(request_id)
        if turn is None:
            return
        if turn.user_text is not None:
            self._pane.set_editing(None)
        self.turnStarted.emit()
        self.refresh_conversations()
        self.show_conversation(turn.conversation_id)
        self._panel.live.reset()
        self._steps.clear()

    @Slot(object)
    def _on_step_update(self, update: StepUpdate) -> None:
        if self.chat.note_step(update.request_id, update.event) is None:
            return
        self._steps.push(update)
        self.stepReceived.emit(update)

    @Slot(list)
    def _on_steps_flushed(self, updates: list[StepUpdate]) -> None:
        """Draw a batch of steps at once: one Markdown render and one chart update."""
        turn = self.chat.turn
        if turn is None or not updates:
            return
        new_steps = self.chat.observe([u.event for u in updates])
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
        self._panel.live.show_progress(turn.stats, new_steps, updates[-1].event)

    @Slot(object)
    def _on_reply_finished(self, outcome: ReplyOutcome) -> None:
        if self.chat.current(outcome.request_id) is None:
            return
        self._steps.flush()
        finished = self.chat.finish(outcome, self._model_name())
        assert finished is not None
        _turn, record = finished
        bubble, self._reply_bubble = self._reply_bubble, None
        if bubble is not None:
            if record.message_id is None:
                self.show_conversation(self.chat.conversation_id)
            else:
                bubble.message_id = record.message_id
                bubble.set_stats_line(record.stats.summary_line())
        self.busyChanged.emit()
        self.turnEnded.emit()
        if outcome.error and not self.closed:
            QMessageBox.warning(self._parent, "The reply failed", outcome.error)
        self.completed.emit(record)

    @Slot(int, str)
    def _on_reply_failed(self, request_id: int, message: str) -> None:
        turn = self.chat.reject(request_id)
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
            QMessageBox.warning(self._parent, "Could not send", message)
        self.rejected.emit(message)

    def close_turn(self) -> None:
        """The window is closing: save a reply the closing stopped, as far as it got."""
        self.closed = True
        turn = self.chat.turn
        if turn is not None and turn.started:
            self._on_reply_finished(ReplyOutcome(turn.request_id, "cancelled", turn.stats.n_tokens, 0))
        self._steps.clear()
