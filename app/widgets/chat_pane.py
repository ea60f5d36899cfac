"""The centre column of the Chat tab: the conversation, the edit banner, the input box and Send/Stop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from ..attachments import Attachment, ReplySources
from ..marks import TokenMarks
from ..stats import ReplyStats
from ..store import StoredMessage
from .attachments_bar import AttachmentsBar
from .chat_input import ChatInput
from .chat_view import ChatView
from .context_meter import ContextMeter
from .file_intake import FileIntake
from .marked_text import MarksLegend
from .message_bubble import MessageBubble
from .plain import Label

WAITING_LINE = "Reading the prompt…"


class ChatPane(QWidget):
    """Shows a chat and takes the next message; knows nothing of the engine or the store.

    Signals:
        sendRequested(): Enter in the input box, or Send.
        stopRequested(): the button while a reply is being written (it reads Stop then).
        editRequested(int): "Edit" on a user message (its store id).
        regenerateRequested(): "Regenerate" on the last reply.
        writeOutRequested(): "Write it out" on the last reply, which the loop guard stopped.
        cancelEditRequested(): "Cancel edit" on the banner.
        alternativeRequested(int): ‹ or › on a message: show that alternative (its store id).
        forkRequested(int): "Fork" on a message (its store id).
        attachmentsChanged(): a file was attached, read, removed or cleared (see ``pending_attachments``).

    Files come in by the paperclip (Ctrl+Shift+A) or by dropping them on the chat or the input box (``files``,
    a ``FileIntake``); the bar above the input shows them.
    """

    sendRequested = Signal()
    stopRequested = Signal()
    editRequested = Signal(int)
    regenerateRequested = Signal()
    writeOutRequested = Signal()
    cancelEditRequested = Signal()
    alternativeRequested = Signal(int)
    forkRequested = Signal(int)
    attachmentsChanged = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._replying = False
        self._build_chat_view()
        self._build_edit_banner()
        input_row = self._build_input_row()
        self.context_meter = ContextMeter()
        self.legend = MarksLegend()
        self.legend.setVisible(False)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.legend)
        layout.addWidget(self.chat_view, 1)
        layout.addWidget(self.context_meter)
        layout.addWidget(self.edit_banner)
        layout.addWidget(self.attachments_bar)
        layout.addLayout(input_row)
        QWidget.setTabOrder(self.input, self.files.button)  # Tab from the message: attach, then send
        QWidget.setTabOrder(self.files.button, self.send_button)

    def _build_chat_view(self) -> None:
        self.chat_view = ChatView()
        self.chat_view.editRequested.connect(self.editRequested)
        self.chat_view.regenerateRequested.connect(self.regenerateRequested)
        self.chat_view.writeOutRequested.connect(self.writeOutRequested)
        self.chat_view.alternativeRequested.connect(self.alternativeRequested)
        self.chat_view.forkRequested.connect(self.forkRequested)

    def _build_edit_banner(self) -> None:
        self.edit_banner = QWidget()
        banner = QHBoxLayout(self.edit_banner)
        banner.setContentsMargins(0, 0, 0, 0)
        banner_text = Label("Editing an earlier message: sending adds the new one beside it (‹ › flips back).")
        banner_text.setWordWrap(True)  # a narrow chat wraps it rather than growing wider than the window
        banner.addWidget(banner_text, 1)
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.clicked.connect(self.cancelEditRequested)
        banner.addWidget(self.cancel_edit_button)
        self.edit_banner.setVisible(False)

    def _build_input_row(self) -> QHBoxLayout:
        """The input box, and beside it the paperclip above Send; the files attached go in the bar above them."""
        self.input = ChatInput()
        self.input.submitted.connect(self.sendRequested)
        self.send_button = QPushButton("Send")
        self.send_button.setToolTip("Send (Enter / Ctrl+Enter)")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._on_button_clicked)
        self.attachments_bar = AttachmentsBar()
        self.attachments_bar.changed.connect(self.attachmentsChanged)
        self.files = FileIntake(self, self.input, self.attachments_bar)
        input_row = QHBoxLayout()
        input_row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.files.button, 0, Qt.AlignmentFlag.AlignRight)
        buttons.addWidget(self.send_button)
        input_row.addLayout(buttons)
        return input_row

    def set_state(self, replying: bool, can_send: bool, busy: bool) -> None:
        """Send becomes Stop while a reply is written; message actions are off while the engine is busy."""
        self._replying = replying
        self.send_button.setText("Stop" if replying else "Send")
        self.send_button.setToolTip("Stop (Esc)" if replying else "Send (Enter / Ctrl+Enter)")
        self.send_button.setEnabled(replying or can_send)
        self.chat_view.set_busy(busy)

    def show_messages(
        self, messages: Sequence[StoredMessage], alternatives: Mapping[int, Sequence[int]] | None = None
    ) -> None:
        """Show a stored chat from the top (each reply with its stats line, each message with its alternatives)."""
        self.chat_view.clear()
        last: ReplyStats | None = None  # the latest reply's: what the context held when it was written
        left_out = 0
        sources: ReplySources | None = None  # the files' passages the user message before a reply gave it
        seen: dict[str, float] = {}  # how much of each file on the branch the model sees
        for k, m in enumerate(messages):
            stats = ReplyStats.from_stats_json(m.stats_json)
            marks = TokenMarks.from_json(m.content, m.marks_json)
            bubble = self.chat_view.add_message(
                m.role, m.content, m.id, stats.summary_line() if stats else "", marks,
                alternatives=(alternatives or {}).get(m.id, ()),
                stopped_looping=stats is not None and stats.stop_reason == "loop",
            )
            files = m.attachments
            placed = ReplySources.from_json(m.documents_json)
            if m.role == "user":
                if files:
                    bubble.set_attachments(files, placed.coverage if placed is not None else None)
                sources = placed
                seen.update(placed.coverage if placed is not None else {})
            elif m.role == "assistant":
                bubble.set_sources(sources)
                sources = None
            if stats is not None:
                last, left_out = stats, min(stats.dropped_messages, k)
        self.chat_view.mark_left_out(left_out)
        self.show_usage(last)
        self.context_meter.set_documents(seen)

    def show_usage(self, stats: ReplyStats | None) -> None:
        """The context meter after (or during) ``stats``' reply: its prompt and its tokens so far."""
        if stats is None:
            self.context_meter.set_usage(None if self.chat_view.bubbles() else 0)
        elif stats.prompt_tokens:
            self.context_meter.set_usage(stats.prompt_tokens + stats.n_tokens, stats.system_tokens)
        else:
            self.context_meter.set_usage(None)  # a reply stored before prompts were counted

    def set_show_lookahead(self, on: bool) -> None:
        """View → Show lookahead: replies tinted by how each run of text came, with the legend."""
        self.legend.setVisible(on)
        self.chat_view.set_show_lookahead(on)

    def show_pending(
        self, history: Sequence[StoredMessage], user_text: str, attachments: Sequence[Attachment] = ()
    ) -> None:
        """The chat as it will be once the message is accepted: the history, the new message, a reply to come."""
        self.show_messages(history)
        bubble = self.chat_view.add_message("user", user_text)
        if attachments:
            bubble.set_attachments(attachments)
        self.add_reply_bubble("")
        self.chat_view.scroll_to_bottom()

    def add_reply_bubble(self, text: str) -> MessageBubble:
        """The bubble a streaming reply writes into; says it is waiting until the first text arrives."""
        bubble = self.chat_view.add_message("assistant", text)
        if not text:
            bubble.set_stats_line(WAITING_LINE)
        return bubble

    def set_editing(self, text: str | None) -> None:
        """Edit mode with ``text`` in the input box, or (None) back to normal."""
        self.edit_banner.setVisible(text is not None)
        if text is not None:
            self.input.setPlainText(text)
            self.input.setFocus()

    def take_input(self) -> tuple[str, str]:
        """(the message to send, the text as typed); the caller clears the box once it sends (see ``give_back``)."""
        typed = self.input.toPlainText()
        return typed.strip(), typed

    def give_back(self, typed: str) -> None:
        """A refused message goes back into the input box, unless something new was typed meanwhile."""
        if not self.input.toPlainText().strip():
            self.input.setPlainText(typed)

    # --- attached files ---

    def pending_attachments(self) -> tuple[Attachment, ...]:
        """The files attached to the message being written that are read (their text is kept: the file may go)."""
        return self.attachments_bar.attachments()

    def clear_attachments(self) -> None:
        """No files on the next message (after a send); reads still running are stopped."""
        self.attachments_bar.clear()

    def set_attachments(self, attachments: Sequence[Attachment]) -> None:
        """Put these files on the message being written (Edit brings back a message's files)."""
        self.attachments_bar.set_attachments(attachments)

    def is_reading_attachments(self) -> bool:
        """Some file is still being read: a send must wait for it."""
        return self.attachments_bar.is_reading()

    def attach_files(self, paths: Sequence[str | Path]) -> None:
        """Read these files (off the GUI thread) and put them on the message being written."""
        self.files.attach(paths)

    def stop_reading(self) -> bool:
        """Stop every file read and wait for the reading threads (before the window closes); False if one did not
        end within seconds."""
        return self.attachments_bar.shutdown()

    @Slot()
    def _on_button_clicked(self) -> None:
        if self._replying:
            self.stopRequested.emit()
        else:
            self.sendRequested.emit()
