"""How files reach the message being written: the paperclip (Ctrl+Shift+A) and its file dialog, and files dropped
on the chat or on the input box. What they bring is read by the ``AttachmentsBar``, which shows them as chips."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, Slot
from PySide6.QtGui import QAction, QDropEvent, QKeySequence, QPalette
from PySide6.QtWidgets import QFileDialog, QPlainTextEdit, QToolButton, QWidget

from engine.documents import SUPPORTED_SUFFIXES

from .attachments_bar import MAX_FILES, AttachmentsBar, paperclip_icon

ATTACH_SHORTCUT = "Ctrl+Shift+A"
DRAG_EVENTS = (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop)


def file_filter() -> str:
    """The attach dialog's filter: every kind of file the app reads, then all files."""
    patterns = " ".join(f"*{suffix}" for suffix in SUPPORTED_SUFFIXES)
    return f"Documents and code ({patterns});;All files (*)"


def _dropped_files(event: QDropEvent) -> list[str]:
    """The local files a drag carries (a dragged link or text is not a file to attach)."""
    mime = event.mimeData()
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]


class FileIntake(QObject):
    """The paperclip's ``action`` and ``button`` on ``pane``, and the files dropped on ``pane`` or on ``input_box``;
    every file goes to ``bar`` to be read. The paperclip takes the colour of the pane's button text."""

    def __init__(self, pane: QWidget, input_box: QPlainTextEdit, bar: AttachmentsBar) -> None:
        super().__init__(pane)
        self._pane = pane
        self._input = input_box
        self._bar = bar
        self._folder = ""  # where the last attached file came from: the dialog starts there
        self.action = QAction("&Attach files…", pane)
        self.action.setShortcut(QKeySequence(ATTACH_SHORTCUT))
        self.action.setToolTip(
            f"Attach files to the message ({ATTACH_SHORTCUT}): text, Markdown, code, CSV, JSON, HTML, PDF or Word; "
            f"up to {MAX_FILES}. You can also drop files on the chat."
        )
        self.action.triggered.connect(self.choose_files)
        pane.addAction(self.action)
        self.button = QToolButton()
        self.button.setObjectName("attachButton")
        self.button.setDefaultAction(self.action)
        self.button.setAccessibleName("Attach files")
        self.button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # Tab reaches it, Space presses it
        self._update_icon()
        # A file dropped on the chat lands on the pane (the messages take no drops); the input box takes dropped
        # text itself, so its drops of files are caught on the way.
        pane.setAcceptDrops(True)
        pane.installEventFilter(self)
        input_box.viewport().installEventFilter(self)

    def attach(self, paths: Sequence[str | Path]) -> None:
        """Read these files (off the GUI thread) and put them on the message being written."""
        if paths:
            self._folder = str(Path(paths[-1]).parent)
        self._bar.attach_paths(paths)

    @Slot()
    def choose_files(self) -> None:
        """The paperclip (Ctrl+Shift+A): pick files to attach."""
        paths, _ = QFileDialog.getOpenFileNames(
            self._pane, "Attach files", self._folder or str(Path.home()), file_filter()
        )
        self.attach(paths)
        self._input.setFocus()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt name)
        # The kind first: the events a pane gets while it is torn down reach here after Python may have
        # cleared this object's attributes, and none of them is ours.
        kind = event.type()
        if kind == QEvent.Type.PaletteChange and watched is self._pane:
            self._update_icon()
        elif kind in DRAG_EVENTS and isinstance(event, QDropEvent):
            # On the pane every drag is ours to judge; on the input box only files are (it inserts anything else).
            if watched is self._pane or _dropped_files(event):
                self._take_drop(event)
                return True
        return super().eventFilter(watched, event)

    def _take_drop(self, event: QDropEvent) -> None:
        files = _dropped_files(event)
        if not files:
            event.ignore()
            return
        event.setDropAction(Qt.DropAction.CopyAction)  # the file stays where it is: only its text is taken
        event.accept()
        if event.type() == QEvent.Type.Drop:
            self.attach(files)

    def _update_icon(self) -> None:
        self.action.setIcon(paperclip_icon(self._pane.palette().color(QPalette.ColorRole.ButtonText)))
