"""The window's menu bar: File, Compare, Chat, Model, View and Help, with their actions and shortcuts.

``build_menu_bar`` lays the menus out. What their items call comes in ``MenuActions`` (the window's slots
and its parts'); the items others made (the recent models, the chats' backup and search, the side panels'
switches) come in ``MenuParts`` and are only placed. It returns ``MenuBar``, the actions and menus it made,
which the window keeps and enables: nothing here reads or sets the window's own attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu

Handler = Callable[[], object]  # a slot an item calls


@dataclass(frozen=True)
class MenuActions:
    """What the menus' items call."""

    open_model: Handler
    export_markdown: Handler
    quit: Handler
    show_compare_tab: Handler
    open_speed_report: Handler
    new_chat: Handler
    stop: Handler
    regenerate: Handler
    open_library: Handler
    show_chat_template: Handler
    serve: Handler
    send: Handler  # Ctrl+Enter, an action outside the menus
    show_lookahead: Callable[[bool], object]
    show_shortcuts: Handler
    open_log_folder: Handler
    show_about: Handler


@dataclass(frozen=True)
class MenuParts:
    """The items made elsewhere, where they go, and how View → Show lookahead starts."""

    recent_models: QMenu  # File, after Open model…
    backup: Sequence[QAction]  # File, after Export chat as Markdown…
    search: Sequence[QAction]  # Chat, after a separator
    side_panels: Sequence[QAction]  # View, after a separator
    lookahead_shown: bool


@dataclass(frozen=True)
class MenuBar:
    """The actions and menus ``build_menu_bar`` made, by the names the window and its tests use."""

    open_action: QAction
    export_action: QAction
    compare_tab_action: QAction
    report_action: QAction
    new_action: QAction
    stop_action: QAction
    regenerate_action: QAction
    library_action: QAction
    template_action: QAction
    serve_action: QAction
    model_menu: QMenu
    send_action: QAction
    show_lookahead_action: QAction
    shortcuts_action: QAction
    log_folder_action: QAction
    about_action: QAction


Item = tuple[str, Handler, Any] | QMenu | None  # (text, slot, shortcut), a submenu, or a separator


def _menu(window: QMainWindow, title: str, *items: Item) -> tuple[QMenu, list[QAction]]:
    """A menu of (text, slot, shortcut) items, submenus, and separators (None); with the items' actions."""
    menu, actions = window.menuBar().addMenu(title), []
    for item in items:
        if item is None:
            menu.addSeparator()
        elif isinstance(item, QMenu):
            menu.addMenu(item)
        else:
            action = menu.addAction(item[0], item[1])
            if item[2] is not None:
                action.setShortcut(QKeySequence(item[2]))
            actions.append(action)
    return menu, actions


def _after(menu: QMenu, action: QAction, added: Sequence[QAction]) -> None:
    """Put ``added`` in ``menu`` just after ``action``."""
    items = menu.actions()
    menu.insertActions(items[items.index(action) + 1], list(added))


def build_menu_bar(window: QMainWindow, do: MenuActions, parts: MenuParts) -> MenuBar:
    """The menus in the menu bar's order, and the actions that live outside them (Ctrl+Enter sends)."""
    file_menu, (open_action, export_action, _quit) = _menu(
        window, "&File", ("&Open model…", do.open_model, QKeySequence.StandardKey.Open), parts.recent_models,
        None, ("&Export chat as Markdown…", do.export_markdown, "Ctrl+Shift+E"), None,
        ("&Quit", do.quit, QKeySequence.StandardKey.Quit),
    )
    open_action.setToolTip("Load a GGUF model file from disk")
    _, (compare_tab_action, report_action) = _menu(
        window, "C&ompare", ("&Side by side", do.show_compare_tab, "Ctrl+K"),
        ("Speed &report…", do.open_speed_report, None),
    )
    chat_menu, (new_action, stop_action, regenerate_action) = _menu(
        window, "&Chat", ("&New chat", do.new_chat, "Ctrl+N"), ("&Stop", do.stop, Qt.Key.Key_Escape),
        ("&Regenerate last reply", do.regenerate, "Ctrl+R"),
    )
    model_menu, (library_action, template_action, serve_action) = _menu(
        window, "&Model", ("&Library…", do.open_library, "Ctrl+Shift+L"),
        ("Chat &template…", do.show_chat_template, None), None, ("&Serve to other programs…", do.serve, None),
    )
    serve_action.setToolTip("Let other programs on this PC use the loaded model through the OpenAI API")
    # Opening a model is a model's business: the Model menu has it first; File keeps the same action.
    model_menu.insertAction(library_action, open_action)
    model_menu.insertSeparator(library_action)
    send_action = QAction("Send", window)
    send_action.setShortcut(QKeySequence("Ctrl+Return"))
    send_action.triggered.connect(do.send)
    window.addAction(send_action)

    show_lookahead_action = _view_menu(window, do, parts)
    # The chats as a whole: the JSON backup in File, search in Chat.
    _after(file_menu, export_action, parts.backup)
    chat_menu.addSeparator()
    chat_menu.addActions(list(parts.search))
    _, (shortcuts_action, log_folder_action, about_action) = _menu(
        window, "&Help", ("&Keyboard shortcuts", do.show_shortcuts, QKeySequence.StandardKey.HelpContents),
        ("Open &log folder", do.open_log_folder, None), ("&About Lookahead Chat", do.show_about, None),
    )
    return MenuBar(
        open_action=open_action, export_action=export_action, compare_tab_action=compare_tab_action,
        report_action=report_action, new_action=new_action, stop_action=stop_action,
        regenerate_action=regenerate_action, library_action=library_action, template_action=template_action,
        serve_action=serve_action, model_menu=model_menu, send_action=send_action,
        show_lookahead_action=show_lookahead_action, shortcuts_action=shortcuts_action,
        log_folder_action=log_folder_action, about_action=about_action,
    )


def _view_menu(window: QMainWindow, do: MenuActions, parts: MenuParts) -> QAction:
    """View: Show lookahead, then the side panels' switches; returns Show lookahead's action."""
    show_lookahead = QAction("Show &lookahead in replies", window)
    show_lookahead.setCheckable(True)
    show_lookahead.setShortcut(QKeySequence("Ctrl+L"))
    show_lookahead.setToolTip("Tint the text each draft source gave; hover a run for its step")
    show_lookahead.setChecked(parts.lookahead_shown)
    show_lookahead.toggled.connect(do.show_lookahead)
    view_menu = window.menuBar().addMenu("&View")
    view_menu.addAction(show_lookahead)
    view_menu.addSeparator()
    view_menu.addActions(list(parts.side_panels))
    return show_lookahead
