"""What the Help menu opens: the keyboard shortcuts (read from the window's actions), the log folder, About."""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import QObject, Qt, QUrl, Slot, qVersion
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtWidgets import QMainWindow, QMenu, QMessageBox

from . import paths
from .requests import LoadedModel
from .widgets import plain
from .widgets.shortcuts import ShortcutsDialog, shortcut_rows


class Help(QObject):
    """Help's three items for ``window``; ``model()`` is the model in use, which About names."""

    def __init__(self, window: QMainWindow, model: Callable[[], LoadedModel | None]) -> None:
        super().__init__(window)
        self._window = window
        self._model = model

    def shortcut_actions(self) -> list[QAction]:
        """Every action of the window, in menu order first, then those that live outside the menus."""
        actions: list[QAction] = []

        def walk(menu_actions: list[QAction]) -> None:
            for action in menu_actions:
                actions.append(action)
                submenu = action.menu()
                if isinstance(submenu, QMenu):
                    walk(submenu.actions())

        walk(self._window.menuBar().actions())
        actions.extend(self._window.actions())
        actions.extend(self._window.findChildren(QAction))
        return actions

    @Slot()
    def show_shortcuts(self) -> ShortcutsDialog:
        """Help → Keyboard shortcuts (F1): read from the actions themselves, so the list is always current."""
        dialog = ShortcutsDialog(shortcut_rows(self.shortcut_actions()), self._window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    @Slot()
    def open_log_folder(self) -> None:
        """Help → Open log folder: the app's log files (warnings, tracebacks) in the system's file manager."""
        try:
            folder = paths.log_dir()
        except OSError as exc:
            self._window.statusBar().showMessage(f"Could not open the log folder: {exc}", 8000)
            return
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    @Slot()
    def show_about(self) -> QMessageBox:
        """Help → About Lookahead Chat: what it is, its version and what it runs on."""
        try:
            version = importlib.metadata.version("lookahead-chat")
        except importlib.metadata.PackageNotFoundError:
            version = "(development copy)"
        model = self._model()
        in_use = f"<p>Model in use: {plain.escape(model.display_name)}</p>" if model else ""
        text = (
            f"<h3>Lookahead Chat {version}</h3>"
            "<p>Chat with a local GGUF model on this computer. Lookahead decoding guesses several tokens ahead "
            "and checks the guesses in the same forward pass, so a reply can take fewer passes.</p>"
            f"{in_use}<p>Qt {qVersion()} · PySide6 {pyside_version} · Python {platform.python_version()}</p>"
        )
        window = self._window
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About Lookahead Chat", text, QMessageBox.StandardButton.Close,
                          window)
        box.setTextFormat(Qt.TextFormat.RichText)
        if not window.windowIcon().isNull():
            box.setIconPixmap(window.windowIcon().pixmap(64, 64))
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box
