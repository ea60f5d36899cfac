"""A reply as written, each run of text tinted by how lookahead got it (View → Show lookahead)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QColor, QHelpEvent, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QWidget

from ..marks import OWN, SHORT_NAMES, SOURCE_NAMES, Run, TokenMarks
from .markdown_view import FittedBrowser, palette_is_dark

# One hue per draft source; the model's own tokens are not tinted.
_HUES = {"prompt": 210, "reply": 120, "history": 275, "other_chats": 30, "kept": 175, "window": 330}


def source_colour(source: str, dark: bool) -> QColor | None:
    """The quiet background of text drafted from ``source`` (None: the model's own, left as it is)."""
    if source == OWN:
        return None
    hue = _HUES.get(source)
    if hue is None:
        return QColor.fromHsl(0, 0, 80 if dark else 210)
    return QColor.fromHsl(hue, 110, 70) if dark else QColor.fromHsl(hue, 170, 212)


class MarkedView(FittedBrowser):
    """The text of ``TokenMarks`` as written, runs appended as a reply streams.

    Hovering a run tells its step, source and the step's batch size.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._runs_shown = 0  # runs of the marks drawn (the last one possibly in part)
        self._last_shown = 0  # characters of that last run drawn

    def show_marks(self, marks: TokenMarks) -> None:
        """Draw ``marks``: only what was added since the last call when they grew at the end."""
        runs = marks.runs
        if len(runs) < self._runs_shown or (
            self._runs_shown and len(runs[self._runs_shown - 1].text) < self._last_shown
        ):
            self.clear()
            self._runs_shown = self._last_shown = 0
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()  # one layout for all the runs added, not one per run
        if self._runs_shown:
            last = runs[self._runs_shown - 1]
            if len(last.text) > self._last_shown:
                cursor.insertText(last.text[self._last_shown :], self._format(last))
        for run in runs[self._runs_shown :]:
            cursor.insertText(run.text, self._format(run))
        cursor.endEditBlock()
        self._runs_shown = len(runs)
        self._last_shown = len(runs[-1].text) if runs else 0

    def _format(self, run: Run) -> QTextCharFormat:
        fmt = QTextCharFormat()
        colour = source_colour(run.source, palette_is_dark(self.palette()))
        if colour is not None:
            fmt.setBackground(colour)
        fmt.setToolTip(run.describe())
        return fmt

    def tooltip_at(self, pos: QPoint) -> str:
        """The tooltip of the run under ``pos`` (viewport coordinates)."""
        return self.cursorForPosition(pos).charFormat().toolTip()

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 (Qt name)
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            tip = self.tooltip_at(event.pos())
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


class MarksLegend(QLabel):
    """What the tints mean: one chip per draft source, and a word on untinted text (wraps in a narrow window)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setContentsMargins(12, 2, 12, 2)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        dark = palette_is_dark(self.palette())
        quiet = self.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText).name()
        chips = []
        for source in _HUES:
            colour = source_colour(source, dark)
            assert colour is not None
            name = SHORT_NAMES[source].replace(" ", "&nbsp;")
            chips.append(f'<span style="background-color: {colour.name()};">&nbsp;{name}&nbsp;</span>')
        self.sources = list(_HUES)
        self.setText(
            f'<span style="color: {quiet};">Drafts that landed, by source:</span> '
            + " ".join(chips)
            + f' <span style="color: {quiet};">· untinted: the model\'s own token of each step</span>'
        )
        self.setToolTip("\n".join(f"{SHORT_NAMES[s]}: {SOURCE_NAMES[s]}" for s in (OWN, *_HUES)))
