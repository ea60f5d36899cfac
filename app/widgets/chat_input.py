"""The message input: Enter (or Ctrl+Enter) sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QSizePolicy, QWidget


class ChatInput(QPlainTextEdit):
    """A plain-text box for the next message.

    Signals:
        submitted(): the user pressed Enter or Ctrl+Enter (the text stays until the owner clears it).
    """

    submitted = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Message the model — Enter sends, Shift+Enter for a new line")
        self.setTabChangesFocus(True)
        line = self.fontMetrics().lineSpacing()
        self.setMinimumHeight(line * 3 + 14)
        self.setMaximumHeight(line * 5 + 14)  # longer messages scroll; the chat keeps the room
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt name)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")  # Shift+Enter: new line
            else:
                self.submitted.emit()  # Enter and Ctrl+Enter both send
            event.accept()
            return
        super().keyPressEvent(event)
