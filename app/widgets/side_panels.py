"""The chats list and the decoding panel beside the chat: shown, hidden, and fitted to the window's width.

Below ``NARROW_WINDOW_WIDTH`` the chat keeps priority: the chats list steps aside and the panel takes its least
width; when the window is wide again both come back as they were. Only a change of width class acts, and never
on a panel the user showed or hid themselves; a splitter they dragged while the window was narrow is not dragged
back. View → Chats list / Decoding panel, and the buttons at the tabs' corners, show and hide them.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QByteArray, QObject, Qt, QTimer, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QScrollArea, QSplitter, QTabWidget, QToolButton, QWidget

# Below this window width the chat keeps priority: the chats list steps aside and the panel takes its least width.
NARROW_WINDOW_WIDTH = 1200
DEFAULT_SPLITTER_SIZES = (220, 760, 380)  # chats list | chat and compare tabs | decoding panel
PANEL_INDEX = 2


class SidePanels(QObject):
    """The splitter's outer parts (``chats``, ``panel_scroll``) around ``tabs``, and the two actions that show them.

    ``chosen(setting, shown)`` is called when the user shows or hides one ("show_chat_list" or
    "show_decoding_panel"): the window keeps it in its settings.
    """

    def __init__(
        self,
        window: QWidget,
        splitter: QSplitter,
        chats: QWidget,
        tabs: QTabWidget,
        panel_scroll: QScrollArea,
        show_chats: bool,
        show_panel: bool,
        chosen: Callable[[str, bool], None],
    ) -> None:
        super().__init__(window)
        self._window = window
        self.splitter = splitter
        self.chats = chats
        self.panel_scroll = panel_scroll
        self._chosen = chosen
        self._narrow: bool | None = None  # the window's width class, once known
        self._auto_hidden_list = False  # the chats list was put away for a narrow window, not by the user
        self._list_chosen = False  # the user showed or hid the chats list: from then on, it is theirs to place
        self._wide_panel_width: int | None = None  # the panel's width before a narrow window narrowed it
        self._wide_splitter_state: QByteArray | None = None  # the splitter as it was, saved while narrowed
        self._splitter_moved = False  # the user dragged a splitter handle since the window turned narrow
        self._hidden_widths: dict[int, int] = {}  # splitter index -> its width when it was hidden
        self._fit_timer = QTimer(self)  # fits the panels once the splitter has laid out at the new size
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(0)
        self._fit_timer.timeout.connect(self._fit)
        panel_scroll.setMinimumWidth(self.panel_min_width())
        splitter.splitterMoved.connect(self._on_splitter_moved)

        self.chat_list_action = QAction("&Chats list", window)
        self.chat_list_action.setIconText("☰ Chats")
        self.chat_list_action.setShortcut(QKeySequence("Ctrl+B"))
        self.chat_list_action.setToolTip("Show or hide the list of chats (Ctrl+B)")
        self.panel_action = QAction("&Decoding panel", window)
        self.panel_action.setIconText("Panel ☰")
        self.panel_action.setShortcut(QKeySequence("Ctrl+Shift+B"))
        self.panel_action.setToolTip("Show or hide the decoding panel: live stats and settings (Ctrl+Shift+B)")
        for action, shown in ((self.chat_list_action, show_chats), (self.panel_action, show_panel)):
            action.setCheckable(True)
            action.setChecked(shown)
        chats.setVisible(show_chats)
        panel_scroll.setVisible(show_panel)
        self.chat_list_action.toggled.connect(lambda on: self._show(self.chats, on))
        self.chat_list_action.triggered.connect(self._on_chat_list_chosen)
        self.panel_action.toggled.connect(lambda on: self._show(self.panel_scroll, on))
        self.panel_action.triggered.connect(lambda on: self._chosen("show_decoding_panel", on))
        # Also as buttons at the tabs' corners, in view when the menus are not.
        self.chat_list_button, self.panel_button = QToolButton(), QToolButton()
        for button, action, corner in ((self.chat_list_button, self.chat_list_action, Qt.Corner.TopLeftCorner),
                                       (self.panel_button, self.panel_action, Qt.Corner.TopRightCorner)):
            button.setDefaultAction(action)
            button.setAutoRaise(True)
            tabs.setCornerWidget(button, corner)

    def panel_min_width(self) -> int:
        """The least width that shows the whole panel: its own least width, the scroll bar and the frame."""
        scroll = self.panel_scroll
        inner = scroll.widget()
        own = inner.minimumSizeHint().width() if inner is not None else 0
        return own + scroll.verticalScrollBar().sizeHint().width() + 2 * scroll.frameWidth()

    def is_narrow(self) -> bool:
        """The window is narrower than ``NARROW_WINDOW_WIDTH``: the side panels give way to the chat."""
        return bool(self._narrow)

    def window_resized(self) -> None:
        """Call from the window's resize event: the panels are fitted once the splitter has its new sizes."""
        self._fit_timer.start()

    def splitter_state(self) -> QByteArray:
        """The splitter as the user arranged it: the wide layout while a narrow window narrowed it for them."""
        if self._wide_splitter_state is not None and not self._splitter_moved:
            return self._wide_splitter_state
        return self.splitter.saveState()

    def _show(self, widget: QWidget, on: bool) -> None:
        index = self.splitter.indexOf(widget)
        if not on and not widget.isHidden():
            width = self.splitter.sizes()[index]
            if width > 0:
                self._hidden_widths[index] = width  # the splitter forgets it if sizes are set meanwhile
        widget.setVisible(on)

    @Slot(bool)
    def _on_chat_list_chosen(self, on: bool) -> None:
        """The user's own choice: kept, saved, and never undone by resizing the window."""
        self._auto_hidden_list = False
        self._list_chosen = True
        self._chosen("show_chat_list", on)

    @Slot()
    def _on_splitter_moved(self) -> None:
        self._splitter_moved = True

    @Slot()
    def _fit(self) -> None:
        narrow = self._window.width() < NARROW_WINDOW_WIDTH
        if narrow == self._narrow:
            return
        self._narrow = narrow
        if narrow:
            self._wide_splitter_state = self.splitter.saveState()
            self._splitter_moved = False
            panel_width = self.splitter.sizes()[PANEL_INDEX]
            self._wide_panel_width = panel_width if panel_width > 0 else None
            if self.chat_list_action.isChecked() and not self._list_chosen:
                self._auto_hidden_list = True
                self.chat_list_action.setChecked(False)
            self._set_panel_width(self.panel_min_width())
            return
        if self._auto_hidden_list:
            self._auto_hidden_list = False
            self.chat_list_action.setChecked(True)
        if self._wide_panel_width is not None and not self._splitter_moved:
            self._set_panel_width(self._wide_panel_width)
        self._wide_splitter_state = None

    def _set_panel_width(self, width: int) -> None:
        """The decoding panel ``width`` wide; the chat takes or gives the difference."""
        sizes = self.splitter.sizes()
        for index, size in enumerate(sizes):
            if size == 0:  # hidden: keep the width it comes back with
                sizes[index] = self._hidden_widths.get(index, DEFAULT_SPLITTER_SIZES[index])
        sizes[1] += sizes[PANEL_INDEX] - width
        sizes[PANEL_INDEX] = width
        self.splitter.setSizes(sizes)
