"""Find messages: in every chat (Ctrl+Shift+F) or in the open one (Ctrl+F), with the matched words in bold."""

from __future__ import annotations

import html
import time
from collections.abc import Callable

from PySide6.QtCore import QEvent, QModelIndex, QObject, QPersistentModelIndex, QSize, Qt, Signal, Slot
from PySide6.QtGui import QAbstractTextDocumentLayout, QKeyEvent, QPainter, QPalette, QTextDocument
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from ..store import MATCH_END, MATCH_START, SearchHit
from .plain import Label

_ID_ROLE = Qt.ItemDataRole.UserRole
_ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
MAX_RESULTS = 100

Search = Callable[[str, int | None], list[SearchHit]]  # (text, a chat's id or None for all) → hits


def snippet_html(snippet: str) -> str:
    """A result's text as HTML on one line, each matched word in bold."""
    text = html.escape(" ".join(snippet.split()))
    return text.replace(html.escape(MATCH_START), "<b>").replace(html.escape(MATCH_END), "</b>")


def hit_html(hit: SearchHit, with_title: bool) -> str:
    """One result: where it is (chat, who, when), then the words around the match."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(hit.created))
    where = [f"<b>{html.escape(hit.title)}</b>"] if with_title else []
    where += [_ROLE_NAMES.get(hit.role, hit.role), when]
    return f"<small>{' · '.join(where)}</small><br>{snippet_html(hit.snippet)}"


class _RichTextDelegate(QStyledItemDelegate):
    """Draws an item's text as HTML (a list widget shows its items' text as it is)."""

    def _document(self, text: str, width: int) -> QTextDocument:
        doc = QTextDocument()
        doc.setDocumentMargin(4)
        doc.setHtml(text)
        doc.setTextWidth(max(width, 100))
        return doc

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        text, opt.text = opt.text, ""  # drawn below, as HTML
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        rect = opt.rect
        doc = self._document(text, rect.width())
        context = QAbstractTextDocumentLayout.PaintContext()
        palette = opt.palette
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        context.palette.setColor(QPalette.ColorRole.Text, palette.color(role))
        painter.save()
        painter.translate(rect.topLeft())
        painter.setClipRect(rect.translated(-rect.topLeft()))
        doc.documentLayout().draw(painter, context)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:  # noqa: N802
        width = option.rect.width() or 480
        doc = self._document(str(index.data(Qt.ItemDataRole.DisplayRole) or ""), width)
        return QSize(width, int(doc.size().height()))


class SearchDialog(QDialog):
    """A search box over the messages, and the results; opening one shows the message in its chat.

    Enter opens the selected result and selects the next, so Enter again goes to the next match.

    Signals:
        resultActivated(int, int): a result was opened (its chat's id, the message's id).
    """

    resultActivated = Signal(int, int)

    def __init__(self, search: Search, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Search chats")
        self._search = search
        self._conversation_id: int | None = None  # the open chat (None: a new one, nothing to find in it)
        self.input = QLineEdit()
        self.input.setPlaceholderText("Words to find…")
        self.input.setClearButtonEnabled(True)
        self.this_chat_only = QCheckBox("Only this chat")
        self.results = QListWidget()
        self.results.setItemDelegate(_RichTextDelegate(self.results))
        self.results.setWordWrap(True)
        self.status = Label()
        self.status.setEnabled(False)  # the palette's quiet text colour

        layout = QVBoxLayout(self)
        layout.addWidget(self.input)
        layout.addWidget(self.this_chat_only)
        layout.addWidget(self.results, 1)
        layout.addWidget(self.status)
        self.resize(560, 480)

        self.input.textChanged.connect(self.refresh)
        self.input.returnPressed.connect(self._on_return)
        self.input.installEventFilter(self)
        self.this_chat_only.toggled.connect(self.refresh)
        self.results.itemActivated.connect(self._on_item_activated)

    def start(self, this_chat_only: bool, conversation_id: int | None) -> None:
        """Show the dialog for a search in the open chat or in all of them, with the box's text selected."""
        self.this_chat_only.blockSignals(True)
        self.this_chat_only.setChecked(this_chat_only)
        self.this_chat_only.blockSignals(False)
        self.setWindowTitle("Find in this chat" if this_chat_only else "Search chats")
        self.set_conversation(conversation_id)
        self.refresh()
        if self.isVisible():  # behind the window: bring it back
            self.raise_()
            self.activateWindow()
        self.show()
        self.input.setFocus()
        self.input.selectAll()

    def set_conversation(self, conversation_id: int | None) -> None:
        """The chat "Only this chat" means (the window's open chat changed)."""
        if conversation_id == self._conversation_id:
            return
        self._conversation_id = conversation_id
        self.this_chat_only.setEnabled(conversation_id is not None)
        if self.this_chat_only.isChecked():
            self.refresh()

    def hits(self) -> list[tuple[int, int]]:
        """The results shown, as (chat id, message id)."""
        return [self.results.item(i).data(_ID_ROLE) for i in range(self.results.count())]

    @Slot()
    def refresh(self) -> None:
        """Search again for what the box says."""
        text = self.input.text()
        in_chat = self.this_chat_only.isChecked() and self._conversation_id is not None
        found = self._search(text, self._conversation_id if in_chat else None) if text.strip() else []
        self.results.clear()
        for hit in found:
            item = QListWidgetItem(hit_html(hit, with_title=not in_chat))
            item.setData(_ID_ROLE, (hit.conversation_id, hit.message_id))
            self.results.addItem(item)
        if found:
            self.results.setCurrentRow(0)
        n = len(found)
        if not text.strip():
            self.status.setText("")
        elif n == 0:
            where = " in this chat" if in_chat else ""
            self.status.setText(f"No message{where} has these words.")
        else:
            more = " (the first ones)" if n >= MAX_RESULTS else ""
            self.status.setText(f"{n} message{'s' if n != 1 else ''}{more} · Enter opens one, Enter again the next")

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt name)
        """Up and Down in the search box move through the results."""
        if watched is self.input and isinstance(event, QKeyEvent) and event.type() == QKeyEvent.Type.KeyPress:
            step = {Qt.Key.Key_Down: 1, Qt.Key.Key_Up: -1}.get(Qt.Key(event.key()), 0)
            if step and self.results.count():
                row = min(max(self.results.currentRow() + step, 0), self.results.count() - 1)
                self.results.setCurrentRow(row)
                return True
        return super().eventFilter(watched, event)

    @Slot()
    def _on_return(self) -> None:
        row = self.results.currentRow()
        if row < 0:
            return
        self._on_item_activated(self.results.item(row))
        if self.results.count():
            self.results.setCurrentRow((row + 1) % self.results.count())

    @Slot(QListWidgetItem)
    def _on_item_activated(self, item: QListWidgetItem) -> None:
        conversation_id, message_id = item.data(_ID_ROLE)
        self.resultActivated.emit(int(conversation_id), int(message_id))
