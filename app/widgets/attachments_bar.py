"""The files attached to the message being written: a chip per file (reading, then read) and a notice of problems.

Files are read off the GUI thread (``app.attach_reader``); a chip shows the
read's progress and × cancels it, then shows the file (``Attachment.chip_text``)
and × removes it. A file that cannot be used is named in the notice with the
reason, and nothing else changes: the message typed so far stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from PySide6.QtCore import QMargins, QPoint, QPointF, QRect, QRectF, QSize, Qt, Signal, Slot
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLayout,
    QLayoutItem,
    QProgressBar,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..attach_reader import AttachmentReader, ReadResult
from ..attachments import Attachment
from .plain import Label
from .plain import tip as plain_tip

MAX_FILES = 10  # per message: more would not fit any context the app's models have, and the chips would not fit


class FlowLayout(QLayout):
    """Lays its widgets out left to right, wrapping onto the next line when the row is full (as words are)."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 (Qt name)
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt name)
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt name)
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 (Qt name)
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt name)
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt name)
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 (Qt name)
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt name)
        return self.minimumSize()

    def minimumSize(self) -> QSize:  # noqa: N802 (Qt name)
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _place(self, rect: QRect, move: bool) -> int:
        """Place (or only measure) the items in ``rect``; returns the height they take."""
        margins: QMargins = self.contentsMargins()
        area = rect.marginsRemoved(margins)
        x, y, line = area.x(), area.y(), 0
        for item in self._items:
            if item.isEmpty():
                continue
            hint = item.sizeHint()
            width = min(hint.width(), area.width())
            if x > area.x() and x + width > area.right() + 1:
                x, y, line = area.x(), y + line + self._spacing, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), QSize(width, hint.height())))
            x += width + self._spacing
            line = max(line, hint.height())
        return y + line - rect.y() + margins.bottom()


def paperclip_icon(colour: QColor, size: int = 20) -> QIcon:
    """A paperclip drawn in ``colour`` (no icon font is needed, and it follows the theme's text colour)."""
    pixmap = QPixmap(size * 2, size * 2)  # drawn at twice the size: sharp on high-DPI screens too
    pixmap.setDevicePixelRatio(2.0)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    # Drawn upright on a 24-unit grid (y down; arcs turn through the bottom or the top), then tilted.
    painter.translate(size / 2, size / 2)
    painter.rotate(40)
    painter.scale(size / 26, size / 26)
    painter.translate(-12, -12)
    painter.setPen(QPen(colour, 1.9, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap, Qt.PenJoinStyle.RoundJoin))
    path = QPainterPath(QPointF(10, 7))
    path.lineTo(10, 16)  # the inner leg...
    path.arcTo(QRectF(10, 14, 4, 4), 180, 180)  # ...round the small bottom bend...
    path.lineTo(14, 5)
    path.arcTo(QRectF(7, 1.5, 7, 7), 0, 180)  # ...over the top...
    path.lineTo(7, 17)
    path.arcTo(QRectF(7, 12, 10, 10), 180, 180)  # ...round the wide bottom bend, and up the outer leg
    path.lineTo(17, 8)
    painter.drawPath(path)
    painter.end()
    return QIcon(pixmap)


class AttachmentChip(QFrame):
    """One file of the message being written: while it is read, its progress and × to stop; then the file and × to
    remove it.

    Signals:
        closeRequested(): × was pressed (cancel the read, or remove the file).
    """

    closeRequested = Signal()

    def __init__(self, name: str, path: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentChip")
        self.name = name
        self.path = path
        self.job: int | None = None  # the read in progress, if any
        self.attachment: Attachment | None = None
        self.label = Label(name)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setFixedSize(56, 6)
        self.progress.setRange(0, 0)  # busy until the first page is read
        self.close_button = QToolButton()
        self.close_button.setObjectName("chipCloseButton")
        self.close_button.setText("×")
        self.close_button.setAutoRaise(True)
        self.close_button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.close_button.clicked.connect(self.closeRequested)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 2, 2, 2)
        layout.setSpacing(6)
        layout.addWidget(self.label)
        layout.addWidget(self.progress)
        layout.addWidget(self.close_button)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        self._set_reading(True)

    def _set_reading(self, reading: bool) -> None:
        self.progress.setVisible(reading)
        what = f"Stop reading {self.name}" if reading else f"Remove {self.name} from the message"
        self.close_button.setToolTip(plain_tip(what))
        self.close_button.setAccessibleName(what)
        self.setToolTip(plain_tip(self.path))

    def is_reading(self) -> bool:
        return self.attachment is None

    def set_progress(self, fraction: float) -> None:
        self.progress.setRange(0, 100)
        self.progress.setValue(round(fraction * 100))

    def set_attachment(self, attachment: Attachment) -> None:
        """The file was read: the chip says what it is."""
        self.attachment = attachment
        self.job = None
        self.label.setText(attachment.chip_text())
        self.path = attachment.path or self.path
        self._set_reading(False)
        if not self.path:
            self.setToolTip(plain_tip(f"{attachment.name} (its text is kept with the message)"))


class AttachmentsBar(QWidget):
    """The chips of the message being written, and a notice naming any file that could not be attached and why.

    Signals:
        changed(): a file was added, read, removed or cancelled (``attachments()``/``is_reading()`` changed).
    """

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.reader = AttachmentReader(self)
        self.reader.progress.connect(self._on_progress)
        self.reader.finished.connect(self._on_read)
        self._chips: list[AttachmentChip] = []

        self.chip_area = QWidget()
        self._flow = FlowLayout(self.chip_area)
        self.chip_area.setVisible(False)

        self.notice = QFrame()
        self.notice.setObjectName("attachNotice")
        self.notice_label = Label()
        self.notice_label.setWordWrap(True)
        self.notice_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.dismiss_button = QToolButton()
        self.dismiss_button.setText("×")
        self.dismiss_button.setAutoRaise(True)
        self.dismiss_button.setToolTip("Dismiss")
        self.dismiss_button.setAccessibleName("Dismiss the note about attached files")
        self.dismiss_button.clicked.connect(self.dismiss_notice)
        notice_row = QHBoxLayout(self.notice)
        notice_row.setContentsMargins(8, 4, 2, 4)
        notice_row.addWidget(self.notice_label, 1)
        notice_row.addWidget(self.dismiss_button, 0, Qt.AlignmentFlag.AlignTop)
        self.notice.setVisible(False)
        self._notes: list[tuple[str, str]] = []  # (text, detail)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.notice)
        layout.addWidget(self.chip_area)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)

    # --- what the pane asks ---

    def attachments(self) -> tuple[Attachment, ...]:
        """The files read so far, in the order they were attached."""
        return tuple(c.attachment for c in self._chips if c.attachment is not None)

    def chips(self) -> list[AttachmentChip]:
        return list(self._chips)

    def is_reading(self) -> bool:
        return any(c.is_reading() for c in self._chips)

    def notices(self) -> list[str]:
        """What the notice says now, one line per file."""
        return [text for text, _detail in self._notes]

    def attach_paths(self, paths: Iterable[str | Path]) -> None:
        """Start reading each file (skipping one attached already, and any beyond ``MAX_FILES``)."""
        added = False
        for raw in paths:
            path = str(raw)
            name = Path(path).name or path
            if any(c.path and _same_file(c.path, path) for c in self._chips):
                self.add_note(f"{name} is attached already.")
                continue
            if len(self._chips) >= MAX_FILES:
                self.add_note(f"{name} was not attached: a message takes at most {MAX_FILES} files.")
                continue
            chip = self._add_chip(AttachmentChip(name, path))
            chip.job = self.reader.start(path)
            added = True
        if added:
            self.changed.emit()

    def set_attachments(self, attachments: Sequence[Attachment]) -> None:
        """Show these (already read) files instead of any now attached; reads in progress are stopped."""
        self._remove_all()
        for attachment in attachments:
            chip = self._add_chip(AttachmentChip(attachment.name, attachment.path))
            chip.set_attachment(attachment)
        self.changed.emit()

    def clear(self) -> None:
        """No files any more (the message was sent): reads in progress stop, the notice goes."""
        self._remove_all()
        self.dismiss_notice()
        self.changed.emit()

    def shutdown(self) -> bool:
        """Stop every read and wait for the reading threads (the window is closing); False if one did not end."""
        return self.reader.shutdown()

    def add_note(self, text: str, detail: str = "") -> None:
        """One more line in the notice (the technical detail, if any, is its tooltip)."""
        self._notes.append((text, detail))
        self.notice_label.setText("\n".join(t for t, _d in self._notes))
        self.notice_label.setToolTip(plain_tip("\n".join(d for _t, d in self._notes if d)))
        self.notice.setVisible(True)

    @Slot()
    def dismiss_notice(self) -> None:
        self._notes.clear()
        self.notice_label.clear()
        self.notice.setVisible(False)

    # --- chips ---

    def _add_chip(self, chip: AttachmentChip) -> AttachmentChip:
        chip.closeRequested.connect(self._on_chip_closed)
        self._chips.append(chip)
        self._flow.addWidget(chip)
        self.chip_area.setVisible(True)
        return chip

    def _remove_chip(self, chip: AttachmentChip) -> None:
        if chip.job is not None:
            self.reader.cancel(chip.job)  # its result, when it comes, finds no chip and is dropped
        self._chips.remove(chip)
        self._flow.removeWidget(chip)
        chip.deleteLater()
        self.chip_area.setVisible(bool(self._chips))

    def _remove_all(self) -> None:
        for chip in list(self._chips):
            self._remove_chip(chip)

    def _chip_of(self, job: int) -> AttachmentChip | None:
        return next((c for c in self._chips if c.job == job), None)

    @Slot()
    def _on_chip_closed(self) -> None:
        chip = self.sender()
        if isinstance(chip, AttachmentChip) and chip in self._chips:
            self._remove_chip(chip)
            self.changed.emit()

    @Slot(int, float)
    def _on_progress(self, job: int, fraction: float) -> None:
        chip = self._chip_of(job)
        if chip is not None:
            chip.set_progress(fraction)

    @Slot(object)
    def _on_read(self, result: object) -> None:
        assert isinstance(result, ReadResult)
        chip = self._chip_of(result.job)
        if chip is None:
            return  # removed (or cleared) while it was read
        if result.attachment is not None:
            chip.set_attachment(result.attachment)
        else:
            self._remove_chip(chip)
            if not result.cancelled:
                self.add_note(f"Could not attach {result.error}", result.detail)
        self.changed.emit()


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b
