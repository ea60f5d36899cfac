"""The conversation: one bubble per message in a scroll area that follows the stream."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsOpacityEffect,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..marks import TokenMarks
from .markdown_view import MarkdownView
from .marked_text import MarkedView

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
        self._text = text
        self._body_stale = False  # text set while the marked view was shown instead
        self.marks: TokenMarks | None = None
        self.marked: MarkedView | None = None  # made when first shown
        self._show_marks = False
        self.is_left_out = False

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
        self._layout = layout
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
        return self._text

    def set_text(self, text: str, marks: TokenMarks | None = None) -> None:
        """The message's text, and how lookahead got it (replies; drawn when Show lookahead is on)."""
        self._text = text
        if marks is not None:
            self.marks = marks
        if self._marks_shown():
            self._body_stale = True  # rendered when the Markdown view comes back
            self._show_marked()
        else:
            self.body.set_markdown(text)
        self._update_view()

    def set_show_lookahead(self, on: bool) -> None:
        """Show the text as written with its runs tinted by source (if it has marks), or as Markdown."""
        self._show_marks = on
        if self._marks_shown():
            self._show_marked()
        elif self._body_stale:
            self.body.set_markdown(self._text)
            self._body_stale = False
        self._update_view()

    def set_left_out(self, left_out: bool) -> None:
        """Dim a message the model no longer sees (it is still saved and exported)."""
        self.is_left_out = left_out
        if left_out and self.graphicsEffect() is None:
            effect = QGraphicsOpacityEffect(self)
            effect.setOpacity(0.45)
            self.setGraphicsEffect(effect)
        elif not left_out and self.graphicsEffect() is not None:
            self.setGraphicsEffect(None)  # type: ignore[arg-type]  # None removes the effect
        self.setToolTip("Left out of what the model sees: the chat outgrew its context" if left_out else "")

    def _show_marked(self) -> None:
        if self.marked is None:
            self.marked = MarkedView(self)
            self._layout.insertWidget(self._layout.indexOf(self.body), self.marked)
        assert self.marks is not None
        self.marked.show_marks(self.marks)

    def _marks_shown(self) -> bool:
        return self._show_marks and self.marks is not None and bool(self.marks.runs)

    def _update_view(self) -> None:
        shown = self._marks_shown()
        self.body.setVisible(not shown)
        if self.marked is not None:
            self.marked.setVisible(shown)

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
        self.left_out_line: QLabel | None = None  # where the model's memory now starts, if messages are left out
        self._show_lookahead = False
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
        self._drop_left_out_line()
        self._empty.setVisible(True)
        self._follow = True

    def set_show_lookahead(self, on: bool) -> None:
        """Tint the replies' text by how lookahead got it (those that have marks), or show Markdown."""
        self._show_lookahead = on
        for bubble in self._bubbles:
            bubble.set_show_lookahead(on)

    def add_message(
        self,
        role: str,
        text: str,
        message_id: int | None = None,
        stats_line: str = "",
        marks: TokenMarks | None = None,
    ) -> MessageBubble:
        bubble = MessageBubble(role, text, message_id)
        bubble.marks = marks
        bubble.set_show_lookahead(self._show_lookahead)
        bubble.set_stats_line(stats_line)
        bubble.editRequested.connect(self.editRequested)
        bubble.regenerateRequested.connect(self.regenerateRequested)
        self._layout.insertWidget(self._layout.count() - 1, bubble)
        self._bubbles.append(bubble)
        self._empty.setVisible(False)
        self._update_regenerate()
        return bubble

    def mark_left_out(self, count: int) -> None:
        """The first ``count`` messages no longer fit the context: dim them, and draw a line where it now starts."""
        self._drop_left_out_line()
        count = min(count, len(self._bubbles))
        for k, bubble in enumerate(self._bubbles):
            bubble.set_left_out(k < count)
        if count <= 0:
            return
        self.left_out_line = QLabel(
            f"The model no longer sees the {count} message{'s' if count != 1 else ''} above: the chat outgrew its "
            "context (see the meter below). They stay saved and exported."
        )
        self.left_out_line.setObjectName("leftOutLine")
        self.left_out_line.setWordWrap(True)
        self.left_out_line.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._layout.insertWidget(self._layout.indexOf(self._bubbles[count - 1]) + 1, self.left_out_line)

    def left_out(self) -> list[MessageBubble]:
        return [b for b in self._bubbles if b.is_left_out]

    def _drop_left_out_line(self) -> None:
        line, self.left_out_line = self.left_out_line, None
        if line is not None:
            self._layout.removeWidget(line)
            line.deleteLater()

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
