"""The list of chats on the left: select, new, rename (in place), delete."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ..store import Conversation
from .plain import tip as plain_tip

_ID_ROLE = Qt.ItemDataRole.UserRole


class ConversationList(QWidget):
    """Chats, most recent first.

    Signals:
        conversationSelected(int): the user picked a chat (its id).
        newRequested(): "New chat".
        renamed(int, str): a chat's title was edited in place.
        deleteRequested(int): "Delete" on a chat (the owner confirms).
    """

    conversationSelected = Signal(int)
    newRequested = Signal()
    renamed = Signal(int, str)
    deleteRequested = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        # A long title ends in "…" (the whole of it is the tooltip) rather than widening the list sideways.
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setUniformItemSizes(True)
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        buttons = QHBoxLayout()
        for b in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.list, 1)

        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.customContextMenuRequested.connect(self._on_context_menu)
        self.new_button.clicked.connect(self.newRequested)
        self.rename_button.clicked.connect(self._on_rename_clicked)
        self.delete_button.clicked.connect(self._on_delete_clicked)
        self._update_buttons()

    def set_conversations(self, conversations: list[Conversation], current_id: int | None) -> None:
        """Show ``conversations``, selecting ``current_id`` (no selection signal is emitted)."""
        self.list.blockSignals(True)
        try:
            self.list.clear()
            for conv in conversations:
                item = QListWidgetItem(conv.title)
                item.setData(_ID_ROLE, conv.id)
                item.setToolTip(plain_tip(conv.title))
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                self.list.addItem(item)
                if conv.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self.list.blockSignals(False)
        self._update_buttons()

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return int(item.data(_ID_ROLE)) if item is not None else None

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def start_rename(self, conversation_id: int | None = None) -> None:
        item = self._item(conversation_id) if conversation_id is not None else self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _item(self, conversation_id: int) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(_ID_ROLE) == conversation_id:
                return item
        return None

    def _update_buttons(self) -> None:
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_current_changed(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        self._update_buttons()
        if current is not None:
            self.conversationSelected.emit(int(current.data(_ID_ROLE)))

    @Slot(QListWidgetItem)
    def _on_item_changed(self, item: QListWidgetItem) -> None:
        title = item.text().strip()
        if title:
            self.renamed.emit(int(item.data(_ID_ROLE)), title)

    @Slot()
    def _on_rename_clicked(self) -> None:
        self.start_rename()

    @Slot()
    def _on_delete_clicked(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.deleteRequested.emit(cid)

    @Slot(QPoint)
    def _on_context_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        menu = QMenu(self)
        menu.addAction("New chat", self.newRequested.emit)
        if item is not None:
            cid = int(item.data(_ID_ROLE))
            menu.addAction("Rename", lambda: self.list.editItem(item))
            menu.addAction("Delete", lambda: self.deleteRequested.emit(cid))
        menu.exec(self.list.viewport().mapToGlobal(pos))
