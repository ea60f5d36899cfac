"""The chats written to files from the window, and read back: File → Export chat as Markdown… (to read), and the
JSON backup (Export chat as JSON…, Export all chats as JSON…, Import chats from JSON…).

The file dialogs and the JSON backup's actions are here (the JSON format is ``app.backup``'s); the window puts
the actions in its File menu.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QWidget

from . import backup
from .chat_controller import ChatController, file_stem
from .store import Conversation
from .widgets import plain


class BackupActions(QObject):
    """Writes the open chat as Markdown; writes the open chat, or all chats, to a JSON file and adds the chats of
    such a file, as new chats.

    Signals:
        imported(): chats were added to the store (the chats list needs refilling).
        status(str): a short note for the status bar (exported, imported).
    """

    imported = Signal()
    status = Signal(str)

    def __init__(self, controller: ChatController, dialog_parent: QWidget) -> None:
        super().__init__(dialog_parent)
        self.chat = controller
        self._parent = dialog_parent

        def action(text: str, slot: Callable[[], object]) -> QAction:
            a = QAction(text, dialog_parent)
            a.triggered.connect(slot)
            return a

        self.export_json_action = action("Export chat as &JSON…", lambda: self._on_export_json(all_chats=False))
        self.export_all_json_action = action("Export &all chats as JSON…", lambda: self._on_export_json(all_chats=True))
        self.import_json_action = action("&Import chats from JSON…", self._on_import_json)

    @Slot()
    def export_chat_as_markdown(self) -> None:
        """File → Export chat as Markdown…: asks where, then writes the open chat there."""
        export = self.chat.markdown_export()
        if export is not None:
            path, _ = QFileDialog.getSaveFileName(
                self._parent, "Export chat", str(Path.home() / export[0]), "Markdown (*.md);;All files (*)"
            )
            if path:
                self.export_chat(Path(path))

    def export_chat(self, path: Path) -> None:
        """Write the open chat as Markdown to ``path``."""
        export = self.chat.markdown_export()
        try:
            if export is not None:
                path.write_text(export[1], encoding="utf-8")
                self.status.emit(f"Exported to {path}")
        except OSError as exc:
            plain.export_failed(self._parent, path, exc)

    def export_json(self, path: Path, all_chats: bool) -> bool:
        """Write all chats, or the open one, to ``path`` (the JSON format of ``app.backup``); False if it failed."""
        ids = None if all_chats else [self.chat.conversation_id] if self.chat.conversation_id is not None else []
        try:
            path.write_text(backup.export_json(self.chat.store, ids), encoding="utf-8")
        except OSError as exc:
            plain.export_failed(self._parent, path, exc)
            return False
        self.status.emit(f"Exported to {path}")
        return True

    def import_json(self, path: Path) -> list[Conversation]:
        """Add the chats of an exported file (as new chats); a file that cannot be read is explained, not raised."""
        try:
            added = backup.import_json(self.chat.store, path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, backup.BackupError) as exc:
            what = f"Nothing was imported from {path}.\n\n{exc}"
            plain.show_message(self._parent, plain.Icon.Warning, "Import failed", what)
            return []
        self.imported.emit()
        self.status.emit(f"Imported {len(added)} chat{'s' if len(added) != 1 else ''} from {path.name}")
        return added

    def _on_export_json(self, all_chats: bool) -> None:
        conv = self.chat.store.conversation(self.chat.conversation_id) if self.chat.conversation_id else None
        if not all_chats and conv is None:
            return
        name = f"{file_stem(conv.title)}.json" if conv is not None and not all_chats else (
            f"lookahead-chats-{time.strftime('%Y-%m-%d')}.json")
        path, _ = QFileDialog.getSaveFileName(
            self._parent, "Export as JSON", str(Path.home() / name), "JSON (*.json);;All files (*)"
        )
        if path:
            self.export_json(Path(path), all_chats)

    def _on_import_json(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self._parent, "Import chats", str(Path.home()), "JSON (*.json);;All files (*)"
        )
        if path:
            self.import_json(Path(path))
