"""The conversation: one bubble per message in a scroll area that follows the stream."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .markdown_view import MarkdownView

_ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


class MessageBubble(QFrame):
    """One message: who, the Markdown text, actions, and (for replies) the stats line.

    Signals:
        editRequested(int): "Edit" on a user message (its store id).
        regenerateRequested(): "Regenerate" on the last reply.
    """

    editRequested = Signal(int)
    regenerateRequested = Signal()

    def __init__(
        self, role: str, text: str = "", message_id: int | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.role = role
        self.message_id = message_id
        self.setObjectName("userBubble" if role == "user" else "assistantBubble")
        self.setFrameShape(QFrame.Shape.StyledPanel)

        self.title = QLabel(_ROLE_TITLES.get(role, role))
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)

        self.copy_button = self._tool_button("Copy", "Copy this message as Markdown", self._on_copy)
        self.edit_button = self._tool_button("Edit", "Edit and resend (replaces what follows)", self._on_edit)
        self.regenerate_button = self._tool_button("Regenerate", "Generate this reply again", self._on_regenerate)
        self.edit_button.setVisible(role == "user")
        self.regenerate_button.setVisible(False)  # only the last reply, set by the chat view

        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self.title)
        header.addStretch(1)
        for b in (self.edit_button, self.regenerate_button, self.copy_button):
            header.addWidget(b)

        self.body = MarkdownView(self)
        self.body.set_markdown(text)

        self.stats_label = QLabel()
        self.stats_label.setObjectName("statsLine")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label.setVisible(False)
        self.stats_label.setEnabled(False)  # the palette's disabled text colour: a quiet footnote

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        layout.addLayout(header)
        layout.addWidget(self.body)
        layout.addWidget(self.stats_label)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)

    def _tool_button(self, text: str, tip: str, slot: Callable[[], object]) -> QToolButton:
        button = QToolButton(self)
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(slot)
        return button

    def text(self) -> str:
        return self.body.markdown()

    def set_text(self, text: str) -> None:
        self.body.set_markdown(text)

    def set_stats_line(self, line: str) -> None:
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))

    def set_actions_enabled(self, enabled: bool) -> None:
        """Edit and regenerate are off while a reply streams (copy always works)."""
        self.edit_button.setEnabled(enabled and self.message_id is not None)
        self.regenerate_button.setEnabled(enabled)

    @Slot()
    def _on_copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text())

    @Slot()
    def _on_edit(self) -> None:
        if self.message_id is not None:
            self.editRequested.emit(self.message_id)

    @Slot()
    def _on_regenerate(self) -> None:
        self.regenerateRequested.emit()


class ChatView(QScrollArea):
    """The messages of the open conversation, newest at the bottom.

    Signals:
        editRequested(int): forwarded from a user bubble.
        regenerateRequested(): forwarded from the last reply's bubble.
    """

    editRequested = Signal(int)
    regenerateRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # Always on: a bar that comes and goes changes the width, so the height, so the bar...
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self._container = QWidget()
        self._container.setObjectName("chatContainer")
        self._layout = QVBoxLayout(self._container)
        self._layout.setContentsMargins(12, 12, 12, 12)
        self._layout.setSpacing(10)
        self._empty = QLabel(
            "Ask anything.\n\nLookahead decoding guesses several tokens ahead and checks them in one "
            "forward pass: the chart on the right shows how many tokens each pass produced."
        )
        self._empty.setWordWrap(True)
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setEnabled(False)
        self._layout.addWidget(self._empty)
        self._layout.addStretch(1)
        self.setWidget(self._container)
        self._bubbles: list[MessageBubble] = []
        self._follow = True
        # Follow the stream while the user is at the bottom; stay put if they scrolled up to read.
        self.verticalScrollBar().rangeChanged.connect(self._on_range_changed)
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)

    def bubbles(self) -> list[MessageBubble]:
        return list(self._bubbles)

    def clear(self) -> None:
        for bubble in self._bubbles:
            self._layout.removeWidget(bubble)
            bubble.deleteLater()
        self._bubbles.clear()
        self._empty.setVisible(True)
        self._follow = True

    def add_message(self, role: str, text: str, message_id: int | None = None, stats_line: str = "") -> MessageBubble:
        bubble = MessageBubble(role, text, message_id)
        bubble.set_stats_line(stats_line)
        bubble.editRequested.connect(self.editRequested)
        bubble.regenerateRequested.connect(self.regenerateRequested)
        self._layout.insertWidget(self._layout.count() - 1, bubble)
        self._bubbles.append(bubble)
        self._empty.setVisible(False)
        self._update_regenerate()
        return bubble

    def set_busy(self, busy: bool) -> None:
        for bubble in self._bubbles:
            bubble.set_actions_enabled(not busy)

    def _update_regenerate(self) -> None:
        for bubble in self._bubbles:
            bubble.regenerate_button.setVisible(False)
        if self._bubbles and self._bubbles[-1].role == "assistant":
            self._bubbles[-1].regenerate_button.setVisible(True)

    def scroll_to_bottom(self) -> None:
        self._follow = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    @Slot(int, int)
    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    @Slot(int)
    def _on_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 4
