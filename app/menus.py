"""The window's menu bar: File, Compare, Chat, Model, View and Help, with their actions and shortcuts, and what
Help opens (the keyboard shortcuts, the log folder, About).

``build_menu_bar`` makes the actions the window keeps by name (``open_action``,
``stop_action``…) and the side panels the View menu shows and hides; the slots
the actions call are the window's and its parts'.
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import TYPE_CHECKING, Any

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import Qt, QUrl, qVersion
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QMessageBox

from . import paths
from .requests import LoadedModel
from .widgets import plain
from .widgets.shortcuts import ShortcutsDialog, shortcut_rows
from .widgets.side_panels import SidePanels

if TYPE_CHECKING:
    from .main_window import MainWindow


def build_menu_bar(window: MainWindow) -> None:
    """The menus in the menu bar's order, and the actions that live outside them (Ctrl+Enter sends)."""
    _build_menus(window)
    _build_view_menu(window)
    _build_chat_menus(window)
    _build_help_menu(window)


def _build_menus(window: MainWindow) -> None:
    def menu(title: str, *items: tuple[str, Any, Any] | QMenu | None) -> list[QAction]:
        """A menu of (text, slot, shortcut) items, submenus, and separators (None); returns the items' actions."""
        m, actions = window.menuBar().addMenu(title), []
        for item in items:
            if item is None:
                m.addSeparator()
                continue
            if isinstance(item, QMenu):
                m.addMenu(item)
                continue
            action = m.addAction(item[0], item[1])
            if item[2] is not None:
                action.setShortcut(QKeySequence(item[2]))
            actions.append(action)
        return actions

    window.open_action, window.export_action, _quit = menu(
        "&File", ("&Open model…", window.model_dialogs.open_model, QKeySequence.StandardKey.Open), window.recent_menu,
        None, ("&Export chat as Markdown…", window.runner.backup.export_chat_as_markdown, "Ctrl+Shift+E"), None,
        ("&Quit", window.close, QKeySequence.StandardKey.Quit),
    )
    window.open_action.setToolTip("Load a GGUF model file from disk")
    window.compare_tab_action, window.report_action = menu(
        "C&ompare", ("&Side by side", window.show_compare_tab, "Ctrl+K"),
        ("Speed &report…", window.comparisons.open_speed_report, None),
    )
    window.new_action, window.stop_action, window.regenerate_action = menu(
        "&Chat", ("&New chat", window.new_chat, "Ctrl+N"), ("&Stop", window.stop_reply, Qt.Key.Key_Escape),
        ("&Regenerate last reply", window.regenerate_last, "Ctrl+R"),
    )
    window.library_action, window.template_action, window.serve_action = menu(
        "&Model", ("&Library…", window.model_dialogs.open_library, "Ctrl+Shift+L"),
        ("Chat &template…", window.model_dialogs.show_chat_template, None), None,
        ("&Serve to other programs…", window.show_serve_dialog, None),
    )
    window.serve_action.setToolTip("Let other programs on this PC use the loaded model through the OpenAI API")
    # Opening a model is a model's business: the Model menu has it first; File keeps the same action.
    model_menu = window.library_action.parent()
    assert isinstance(model_menu, QMenu)
    window.model_menu = model_menu
    window.model_menu.insertAction(window.library_action, window.open_action)
    window.model_menu.insertSeparator(window.library_action)
    window.send_action = QAction("Send", window)
    window.send_action.setShortcut(QKeySequence("Ctrl+Return"))
    window.send_action.triggered.connect(window._on_send_shortcut)
    window.addAction(window.send_action)


def _build_view_menu(window: MainWindow) -> None:
    window.show_lookahead_action = QAction("Show &lookahead in replies", window)
    window.show_lookahead_action.setCheckable(True)
    window.show_lookahead_action.setShortcut(QKeySequence("Ctrl+L"))
    window.show_lookahead_action.setToolTip("Tint the text each draft source gave; hover a run for its step")
    window.show_lookahead_action.setChecked(window.settings.show_lookahead)
    window.show_lookahead_action.toggled.connect(window._on_show_lookahead)
    view_menu = window.menuBar().addMenu("&View")
    view_menu.addAction(window.show_lookahead_action)
    window._on_show_lookahead(window.settings.show_lookahead)

    # The side panels: a narrow window puts the chats list away and narrows the panel; these bring them back.
    window.side_panels = SidePanels(
        window, window.splitter, window.conversations, window.tabs, window.panel_scroll,
        show_chats=window.settings.show_chat_list, show_panel=window.settings.show_decoding_panel,
        chosen=window._on_side_panel_chosen,
    )
    window.chat_list_action = window.side_panels.chat_list_action
    window.panel_action = window.side_panels.panel_action
    view_menu.addSeparator()
    view_menu.addActions([window.chat_list_action, window.panel_action])


def _build_chat_menus(window: MainWindow) -> None:
    """The chats as a whole (the runner's actions): the JSON backup in File, search in Chat."""
    file_menu, chat_menu = window.export_action.parent(), window.new_action.parent()
    assert isinstance(file_menu, QMenu) and isinstance(chat_menu, QMenu)
    items = file_menu.actions()
    after_export = items[items.index(window.export_action) + 1]
    file_menu.insertActions(after_export, [window.runner.export_json_action, window.runner.export_all_json_action,
                                           window.runner.import_json_action])
    chat_menu.addSeparator()
    chat_menu.addActions([window.runner.find_action, window.runner.search_action])
    window.runner.status.connect(lambda text: window.statusBar().showMessage(text, 5000))


def _build_help_menu(window: MainWindow) -> None:
    help_menu = window.menuBar().addMenu("&Help")
    window.shortcuts_action = help_menu.addAction("&Keyboard shortcuts", window.show_shortcuts)
    window.shortcuts_action.setShortcut(QKeySequence(QKeySequence.StandardKey.HelpContents))
    window.log_folder_action = help_menu.addAction("Open &log folder", window.open_log_folder)
    window.about_action = help_menu.addAction("&About Lookahead Chat", window.show_about)


# --- what Help opens ---


def shortcut_actions(window: QMainWindow) -> list[QAction]:
    """Every action of the window, in menu order first, then those that live outside the menus."""
    actions: list[QAction] = []

    def walk(menu_actions: list[QAction]) -> None:
        for action in menu_actions:
            actions.append(action)
            submenu = action.menu()
            if isinstance(submenu, QMenu):
                walk(submenu.actions())

    walk(window.menuBar().actions())
    actions.extend(window.actions())
    actions.extend(window.findChildren(QAction))
    return actions


def show_shortcuts(window: QMainWindow) -> ShortcutsDialog:
    """Help → Keyboard shortcuts (F1): read from the actions themselves, so the list is always current."""
    dialog = ShortcutsDialog(shortcut_rows(shortcut_actions(window)), window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog


def open_log_folder(window: QMainWindow) -> None:
    """Help → Open log folder: the app's log files (warnings, tracebacks) in the system's file manager."""
    try:
        folder = paths.log_dir()
    except OSError as exc:
        window.statusBar().showMessage(f"Could not open the log folder: {exc}", 8000)
        return
    QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))


def show_about(window: QMainWindow, model: LoadedModel | None) -> QMessageBox:
    """Help → About Lookahead Chat: what it is, its version and what it runs on."""
    try:
        version = importlib.metadata.version("lookahead-chat")
    except importlib.metadata.PackageNotFoundError:
        version = "(development copy)"
    in_use = f"<p>Model in use: {plain.escape(model.display_name)}</p>" if model else ""
    text = (
        f"<h3>Lookahead Chat {version}</h3>"
        "<p>Chat with a local GGUF model on this computer. Lookahead decoding guesses several tokens ahead "
        "and checks the guesses in the same forward pass, so a reply can take fewer passes.</p>"
        f"{in_use}<p>Qt {qVersion()} · PySide6 {pyside_version} · Python {platform.python_version()}</p>"
    )
    box = QMessageBox(QMessageBox.Icon.NoIcon, "About Lookahead Chat", text, QMessageBox.StandardButton.Close,
                      window)
    box.setTextFormat(Qt.TextFormat.RichText)
    if not window.windowIcon().isNull():
        box.setIconPixmap(window.windowIcon().pixmap(64, 64))
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box
