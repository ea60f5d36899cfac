"""The conversation: one bubble per message (``message_bubble``) in a scroll area that follows the stream."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from ..marks import TokenMarks
from .message_bubble import FLASH_MS, MessageBubble, tab_stops
from .plain import Label


class ChatView(QScrollArea):
    """The messages of the open conversation, newest at the bottom.

    Signals:
        editRequested(int): forwarded from a user bubble.
        regenerateRequested(): forwarded from the last reply's bubble.
        writeOutRequested(): forwarded from the last reply's bubble (a reply the loop guard stopped).
        alternativeRequested(int): forwarded from a bubble's ‹ ›.
        forkRequested(int): forwarded from a bubble's "Fork".
    """

    editRequested = Signal(int)
    regenerateRequested = Signal()
    writeOutRequested = Signal()
    alternativeRequested = Signal(int)
    forkRequested = Signal(int)

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
        self._empty = Label(
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
        self._busy = False
        self._follow = True
        self._anchor: MessageBubble | None = None  # kept at the top of the view while the layout settles
        self._anchor_timer = QTimer(self)
        self._anchor_timer.setSingleShot(True)
        self._anchor_timer.setInterval(FLASH_MS)
        self._anchor_timer.timeout.connect(self._release_anchor)
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
        self._anchor = None

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
        alternatives: Sequence[int] = (),
        stopped_looping: bool = False,
    ) -> MessageBubble:
        bubble = MessageBubble(role, text, message_id)
        bubble.stopped_looping = stopped_looping
        bubble.marks = marks
        bubble.set_show_lookahead(self._show_lookahead)
        bubble.set_stats_line(stats_line)
        bubble.set_alternatives(alternatives)
        bubble.set_actions_enabled(not self._busy)
        bubble.editRequested.connect(self.editRequested)
        bubble.regenerateRequested.connect(self.regenerateRequested)
        bubble.writeOutRequested.connect(self.writeOutRequested)
        bubble.alternativeRequested.connect(self.alternativeRequested)
        bubble.forkRequested.connect(self.forkRequested)
        self._layout.insertWidget(self._layout.count() - 1, bubble)
        self._chain_focus(bubble, self._bubbles[-1].last_in_tab_order() if self._bubbles else self)
        self._bubbles.append(bubble)
        self._empty.setVisible(False)
        self._update_regenerate()
        return bubble

    @staticmethod
    def _chain_focus(bubble: MessageBubble, after: QWidget) -> None:
        # A new widget joins the end of its window's tab order, after every panel of the window; Tab should
        # reach the messages from the chat in the order they are read instead.
        for widget in tab_stops(bubble, bubble):
            QWidget.setTabOrder(after, widget)
            after = widget

    def mark_left_out(self, count: int) -> None:
        """The first ``count`` messages no longer fit the context: dim them, and draw a line where it now starts."""
        self._drop_left_out_line()
        count = min(count, len(self._bubbles))
        for k, bubble in enumerate(self._bubbles):
            bubble.set_left_out(k < count)
        if count <= 0:
            return
        self.left_out_line = Label(
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
        self._busy = busy
        for bubble in self._bubbles:
            bubble.set_actions_enabled(not busy)

    def set_last_stopped_looping(self, on: bool) -> None:
        """The last reply was (or was not) stopped by the loop guard: offer to write it out anyway."""
        if self._bubbles:
            self._bubbles[-1].stopped_looping = on
            self._update_regenerate()

    def _update_regenerate(self) -> None:
        for bubble in self._bubbles:
            bubble.regenerate_button.setVisible(False)
            bubble.write_out_button.setVisible(False)
        if self._bubbles and self._bubbles[-1].role == "assistant":
            self._bubbles[-1].regenerate_button.setVisible(True)
            self._bubbles[-1].write_out_button.setVisible(self._bubbles[-1].stopped_looping)

    def scroll_to_bottom(self) -> None:
        self._follow = True
        self._anchor = None
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def bubble_for(self, message_id: int) -> MessageBubble | None:
        return next((b for b in self._bubbles if b.message_id == message_id), None)

    def scroll_to_message(self, message_id: int, flash: bool = True) -> MessageBubble | None:
        """Bring a message to the top of the view (and outline it for a moment); None if it is not shown."""
        bubble = self.bubble_for(message_id)
        if bubble is None:
            return None
        self._follow = False
        self._anchor = bubble
        self._layout.activate()  # the bubbles just added get their places now
        self._scroll_to_anchor()
        self._anchor_timer.start()
        if flash:
            bubble.flash()
        return bubble

    @Slot()
    def _release_anchor(self) -> None:
        self._anchor = None

    def _scroll_to_anchor(self) -> None:
        if self._anchor is not None:
            self.verticalScrollBar().setValue(self._anchor.y() - self._layout.spacing())

    @Slot(int, int)
    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._anchor is not None:
            self._scroll_to_anchor()  # Markdown lays out late: the message would drift away
        elif self._follow:
            self.verticalScrollBar().setValue(maximum)

    @Slot(int)
    def _on_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 4
