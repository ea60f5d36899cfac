"""Help → Keyboard shortcuts: every shortcut the window has, read from its actions so the list cannot go stale."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

# Keys handled by widgets rather than actions: written here, since no action carries them.
WIDGET_KEYS: tuple[tuple[str, str], ...] = (
    ("Send the message (in the input box)", "Enter"),
    ("New line in the message", "Shift+Enter"),
    ("Cancel editing an earlier message (when no reply is being written)", "Esc"),
    ("Move through the messages' buttons (Edit, Fork, Copy…), the input and the panel", "Tab / Shift+Tab"),
    ("Press the focused button", "Space"),
    ("Next / previous result (in Find and Search)", "Down / Up"),
)


@dataclass(frozen=True)
class ShortcutRow:
    """One line of the list: what the keys do, and the keys as the platform writes them."""

    what: str
    keys: str


def action_label(action: QAction) -> str:
    """The action's text as a menu shows it, without the mnemonic ``&`` and the trailing ellipsis."""
    return action.text().replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").rstrip(".")


def shortcut_text(action: QAction) -> str:
    """All of the action's shortcuts, in the platform's own notation (Ctrl+O, ⌘O…)."""
    return ", ".join(key.toString(QKeySequence.SequenceFormat.NativeText) for key in action.shortcuts())


def shortcut_rows(actions: Iterable[QAction]) -> list[ShortcutRow]:
    """A row for each distinct action that has a shortcut (in the order given), then the widgets' own keys."""
    rows: list[ShortcutRow] = []
    seen: set[int] = set()
    for action in actions:
        if id(action) in seen or action.isSeparator() or not action.shortcuts():
            continue
        seen.add(id(action))
        rows.append(ShortcutRow(action_label(action), shortcut_text(action)))
    rows.extend(ShortcutRow(what, keys) for what, keys in WIDGET_KEYS)
    return rows


class ShortcutsDialog(QDialog):
    """A two-column table of shortcuts; ``rows`` is what it shows."""

    def __init__(self, rows: Sequence[ShortcutRow], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.rows = list(rows)
        self.table = QTableWidget(len(self.rows), 2)
        self.table.setHorizontalHeaderLabels(["Action", "Keys"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.table.setWordWrap(True)
        for i, row in enumerate(self.rows):
            self.table.setItem(i, 0, QTableWidgetItem(row.what))
            self.table.setItem(i, 1, QTableWidgetItem(row.keys))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.table.resizeRowsToContents()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        self.resize(560, min(640, 80 + 28 * len(self.rows)))
