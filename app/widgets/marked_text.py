"""A reply rendered as Markdown, each run of its text tinted by how lookahead got it (View → Show lookahead)."""

from __future__ import annotations

from bisect import bisect_right

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QColor, QHelpEvent, QPalette, QTextCharFormat, QTextDocument
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QWidget

from engine import DraftOrigin

from ..marks import OWN, SHORT_NAMES, SOURCE_NAMES, TokenMarks, aligned_pieces, rendered_spans
from .markdown_view import MarkdownView, palette_is_dark, render_markdown
from .plain import tip as plain_tip

# One hue per draft source; the model's own tokens are not tinted.
# Attached files are yellow, as a highlighter on paper.
_HUES: dict[str, int] = {
    DraftOrigin.PROMPT: 210, DraftOrigin.DOCUMENT: 55, DraftOrigin.REPLY: 120, DraftOrigin.HISTORY: 275,
    DraftOrigin.OTHER_CHATS: 30, DraftOrigin.KEPT: 175, DraftOrigin.WINDOW: 330,
}


def source_colour(source: str, dark: bool) -> QColor | None:
    """The quiet background of text drafted from ``source`` (None: the model's own, left as it is)."""
    if source == OWN:
        return None
    hue = _HUES.get(source)
    if hue is None:
        return QColor.fromHsl(0, 0, 80 if dark else 210)
    return QColor.fromHsl(hue, 110, 70) if dark else QColor.fromHsl(hue, 170, 212)


def _luminance(colour: QColor) -> float:
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def contrast_ratio(a: QColor, b: QColor) -> float:
    """WCAG's contrast ratio of two colours: 1 (the same) to 21 (black on white); body text wants 4.5."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def readable_on(background: QColor, preferred: QColor) -> QColor:
    """``preferred`` if it reads well on ``background`` (4.5:1), else black or white, whichever reads better."""
    if contrast_ratio(preferred, background) >= 4.5:
        return preferred
    black, white = QColor(0, 0, 0), QColor(255, 255, 255)
    return black if contrast_ratio(black, background) >= contrast_ratio(white, background) else white


class MarkedView(MarkdownView):
    """The text of ``TokenMarks`` as Markdown, with each drafted run's rendered text on its source's tint.

    Markdown drops its syntax, so the runs (pieces of the text as written) are found in
    the rendered text in order (``aligned_pieces``): a run that was only syntax (``**``,
    a fence) tints nothing, one that was partly syntax tints what is shown of it.
    Hovering the text tells the step of its run, its source and the step's batch size.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.marks = TokenMarks()
        self._shown: tuple[str, int] | None = None  # (text, number of runs) drawn last
        self._scratch = QTextDocument(self)
        self._span_starts: list[int] = []
        self.spans: list[tuple[int, int, int]] = []  # (document start, end, run index): where each run is shown

    def show_marks(self, marks: TokenMarks) -> None:
        """Render ``marks``' text as Markdown and tint each drafted run where it shows (no-op if unchanged)."""
        text = marks.text()
        if self._shown == (text, len(marks.runs)):
            return
        self._shown = (text, len(marks.runs))
        self.marks = TokenMarks(list(marks.runs))
        # Where the runs show is worked out on a copy rendered without a view (no layout), so the view itself is
        # rendered and laid out once, tints and all: a long reply streams in at every update.
        render_markdown(self._scratch, text)
        self.spans = rendered_spans(self.marks.runs, aligned_pieces(text, self._scratch.toPlainText()))
        self._span_starts = [start for start, _end, _k in self.spans]
        dark = palette_is_dark(self.palette())
        formats: dict[str, QTextCharFormat | None] = {}  # a long reply has thousands of runs, a few sources
        tints = []
        for start, end, k in self.spans:
            source = self.marks.runs[k].source
            if source not in formats:
                colour = source_colour(source, dark)
                formats[source] = None if colour is None else QTextCharFormat()
                if colour is not None:
                    formats[source].setBackground(colour)  # type: ignore[union-attr]
            fmt = formats[source]
            if fmt is not None:
                tints.append((start, end, fmt))
        self._highlighter.set_tints(tints, redraw=False)
        self.set_markdown(text)

    def run_at(self, position: int) -> int | None:
        """The index of the run shown at document ``position``, or None (Markdown's own, or no text there)."""
        n = bisect_right(self._span_starts, position) - 1
        if n >= 0 and position < self.spans[n][1]:
            return self.spans[n][2]
        return None

    def tooltip_at(self, pos: QPoint) -> str:
        """The tooltip of the run under ``pos`` (viewport coordinates): its step, source and batch."""
        position = self.cursorForPosition(pos).position()
        for p in (position - 1, position):  # the character left of the cursor, or the first of its line
            k = self.run_at(p)
            if k is not None:
                return self.marks.runs[k].describe()
        return ""

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 (Qt name)
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            tip = self.tooltip_at(event.pos())
            if tip:
                QToolTip.showText(event.globalPos(), plain_tip(tip), self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


class MarksLegend(QLabel):
    """What the tints mean: one chip per draft source, and a word on untinted text (wraps in a narrow window).

    Every chip's text is chosen to read on its tint (4.5:1), and the words in the
    palette's own text colour, so the legend stays legible in light and dark themes.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setContentsMargins(12, 2, 12, 2)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.sources = list(_HUES)
        self.colours: dict[str, tuple[QColor, QColor]] = {}  # source → (text, background) of its chip
        self.setToolTip("\n".join(f"{SHORT_NAMES[s]}: {SOURCE_NAMES[s]}" for s in (OWN, *_HUES)))
        self._draw()

    def _draw(self) -> None:
        palette = self.palette()
        dark = palette_is_dark(palette)
        words = palette.color(QPalette.ColorRole.WindowText)
        chips = []
        for source in self.sources:
            background = source_colour(source, dark)
            assert background is not None
            text = readable_on(background, words)
            self.colours[source] = (text, background)
            name = SHORT_NAMES[source].replace(" ", "&nbsp;").replace("-", "&#8209;")  # a chip never breaks
            chips.append(
                f'<span style="background-color: {background.name()}; color: {text.name()};">&nbsp;{name}&nbsp;</span>'
            )
        self.setText(
            "Drafts that landed, by source: " + " ".join(chips) + " · untinted: the model's own token of each step"
        )

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt name)
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._draw()  # the theme changed: tints and chip text follow it
