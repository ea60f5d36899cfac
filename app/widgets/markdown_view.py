"""Markdown rendered by Qt, with fenced code coloured by Pygments."""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable
from functools import lru_cache

from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal, Slot
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QGuiApplication,
    QKeyEvent,
    QPalette,
    QResizeEvent,
    QSyntaxHighlighter,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextOption,
)
from PySide6.QtWidgets import QSizePolicy, QTextBrowser, QToolButton, QWidget

from .plain import tip as plain_tip

_CODE_LANGUAGE = QTextFormat.Property.BlockCodeLanguage
# GitHub's Markdown (tables, strikethrough, autolinks) with raw HTML read as text: a reply that mentions <div>,
# vector<int> or a<b shows those characters, and no reply can restyle the chat or embed anything.
MARKDOWN_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
)
# The only links a click opens (in the system's browser or mail program); any other scheme stays text.
LINK_SCHEMES = frozenset({"http", "https", "mailto"})
COPIED_MS = 1500  # how long a copy button says "Copied ✓"
COPIED_TEXT = "Copied ✓"


def palette_is_dark(palette: QPalette | None = None) -> bool:
    """Whether the system palette is a dark one (we follow it rather than pick colours)."""
    palette = palette or QGuiApplication.palette()
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


def keep_line_breaks(text: str) -> str:
    """Make single newlines hard breaks, as chat models mean them (poems, lists without markers).

    Markdown joins lines of a paragraph; a trailing double space keeps the break.
    Fenced code is left alone.
    """
    out = []
    in_fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence = not in_fence
            out.append(line)
        elif in_fence or not line.strip():
            out.append(line)
        else:
            out.append(line.rstrip() + "  ")
    return "\n".join(out)


_IMAGE = re.compile(r"!(\[[^\]]*\]\()")


def images_as_links(text: str) -> str:
    """Markdown images (``![alt](src)``) outside code turned into links: a reply shows an image's alt text and
    its address, and the app never loads a file or an address a model named."""
    out = []
    in_fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence = not in_fence
        elif not in_fence and "![" in line:
            parts = line.split("`")  # even pieces lie outside inline code
            line = "`".join(_IMAGE.sub(r"\1", p) if i % 2 == 0 else p for i, p in enumerate(parts))
        out.append(line)
    return "\n".join(out)


def render_markdown(document: QTextDocument, text: str) -> None:
    """Put ``text`` (a message) into ``document`` as Markdown without HTML or images, single newlines kept."""
    document.setMarkdown(keep_line_breaks(images_as_links(text)), MARKDOWN_FEATURES)


def open_link(url: QUrl) -> bool:
    """Open a link the user clicked, if it is a web or mail address; returns whether it was opened."""
    if url.scheme().lower() not in LINK_SCHEMES or not url.isValid():
        return False
    return QDesktopServices.openUrl(url)


def _is_code(block: QTextBlock) -> bool:
    return block.isValid() and block.blockFormat().hasProperty(_CODE_LANGUAGE)


@lru_cache(maxsize=256)
def _lex(language: str, code: str) -> tuple[tuple[tuple[int, int, object], ...], ...]:
    """Token ranges per line of ``code``: ((start, length, token type), ...) for each line."""
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ()
    lines: list[list[tuple[int, int, object]]] = [[]]
    col = 0
    for ttype, value in lexer.get_tokens(code):
        parts = value.split("\n")
        for i, part in enumerate(parts):
            if i:
                lines.append([])
                col = 0
            if part:
                lines[-1].append((col, len(part), ttype))
                col += len(part)
    return tuple(tuple(line) for line in lines)


class ActionButton(QToolButton):
    """A flat tool button that Tab reaches and Enter, Return or Space presses (Qt's own take Space only)."""

    def __init__(self, text: str, tip: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setText(text)
        self.setToolTip(plain_tip(tip))
        self.setAutoRaise(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt name)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not event.isAutoRepeat():
            self.animateClick()
            return
        super().keyPressEvent(event)


class CopyButton(ActionButton):
    """Puts a text on the clipboard and says "Copied ✓" for a moment.

    Signals:
        copied(str): the text just put on the clipboard.
    """

    copied = Signal(str)

    def __init__(self, text: str, tip: str, source: Callable[[], str], parent: QWidget | None = None) -> None:
        super().__init__(text, tip, parent)
        self.label = text
        self.source = source  # called at each click: what to copy then
        self._restore = QTimer(self)
        self._restore.setSingleShot(True)
        self._restore.setInterval(COPIED_MS)
        self._restore.timeout.connect(self._on_restore)
        self.clicked.connect(self._on_clicked)

    @Slot()
    def _on_clicked(self) -> None:
        text = self.source()
        QGuiApplication.clipboard().setText(text)
        self.setText(COPIED_TEXT)
        self._restore.start()
        self.copied.emit(text)

    @Slot()
    def _on_restore(self) -> None:
        self.setText(self.label)


class CodeHighlighter(QSyntaxHighlighter):
    """Colours the code blocks Qt's Markdown reader marks with a language, and lays tints over ranges of text.

    Qt keeps each line of a fenced block as its own text block; the whole fence
    is lexed at once (and cached) so multi-line strings and comments come out right.
    Tints (``set_tints``) are drawn over the rendered text, code or not, without
    changing the document: it stays the Markdown as read, quick to lay out.
    """

    def __init__(self, document: QTextDocument, dark: bool) -> None:
        super().__init__(document)
        # Foreground colours only: the background stays the palette's.
        self._style = get_style_by_name("monokai" if dark else "default")
        self._formats: dict[object, QTextCharFormat] = {}
        self._tints: list[tuple[int, int, QTextCharFormat]] = []  # (start, end, format), document positions
        self._tint_starts: list[int] = []

    def set_tints(self, tints: list[tuple[int, int, QTextCharFormat]], redraw: bool = True) -> None:
        """Backgrounds over document ranges [start, end), in order (drawn at once unless ``redraw`` is off)."""
        self._tints = tints
        self._tint_starts = [start for start, _end, _fmt in tints]
        if redraw:
            self.rehighlight()

    def _format(self, ttype: object) -> QTextCharFormat:
        fmt = self._formats.get(ttype)
        if fmt is None:
            fmt = QTextCharFormat()
            style = self._style.style_for_token(ttype)
            if style["color"]:
                fmt.setForeground(QColor("#" + style["color"]))
            if style["bold"]:
                fmt.setFontWeight(QFont.Weight.Bold)
            if style["italic"]:
                fmt.setFontItalic(True)
            self._formats[ttype] = fmt
        return fmt

    def highlightBlock(self, text: str) -> None:  # noqa: N802 (Qt name)
        block = self.currentBlock()
        code = _is_code(block)
        if code:
            self._colour_code(block)
        if self._tints:
            self._tint(block.position(), len(text), code)

    def _tint(self, position: int, length: int, code: bool) -> None:
        k = max(0, bisect_right(self._tint_starts, position) - 1)
        for start, end, fmt in self._tints[k:]:
            if start >= position + length:
                break
            first, last = max(start, position) - position, min(end, position + length) - position
            if first >= last:
                continue
            if not code:
                self.setFormat(first, last - first, fmt)
                continue
            for i in range(first, last):  # keep the code's colours under the tint
                merged = QTextCharFormat(self.format(i))
                merged.merge(fmt)
                self.setFormat(i, 1, merged)

    def _colour_code(self, block: QTextBlock) -> None:
        language = str(block.blockFormat().property(_CODE_LANGUAGE) or "")
        if not language:
            return
        first = block
        while _is_code(first.previous()):
            first = first.previous()
        lines: list[str] = []
        index, b = 0, first
        while _is_code(b):
            if b == block:
                index = len(lines)
            lines.append(b.text())
            b = b.next()
        ranges = _lex(language.lower(), "\n".join(lines))
        if index < len(ranges):
            for start, length, ttype in ranges[index]:
                self.setFormat(start, length, self._format(ttype))


class FittedBrowser(QTextBrowser):
    """A read-only text view as tall as its text, on the bubble's background (the chat's scroll area scrolls)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QTextBrowser.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        # Nothing may run off the right edge (there is no sideways scrolling): long words and code lines wrap.
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.viewport().setAutoFillBackground(False)
        # Read-only, so a dropped file is not its business: the drop goes on to the chat pane, which attaches it.
        self.setAcceptDrops(False)
        self.viewport().setAcceptDrops(False)
        self.document().setUndoRedoEnabled(False)  # read-only: formatting a long reply need not be undoable
        self.document().documentLayout().documentSizeChanged.connect(self._on_document_size_changed)
        # A click on a link never navigates this view; only web and mail links open, outside the app.
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(open_link)

    def loadResource(self, kind: int, name: QUrl | str) -> object:  # noqa: N802 (Qt name)
        """Nothing is loaded for a message: an image in a reply shows as its text, never a file or an address."""
        return None

    @Slot()
    def _on_document_size_changed(self) -> None:
        self._fit_height()

    def _fit_height(self) -> None:
        margins = self.contentsMargins()
        height = math.ceil(self.document().size().height()) + margins.top() + margins.bottom()
        if height != self.height():
            self.setFixedHeight(max(height, self.fontMetrics().height()))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        self._fit_height()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(super().sizeHint().width(), self.height())


class MarkdownView(FittedBrowser):
    """Markdown, with fenced code coloured, wrapped, and a "Copy code" button above each block."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("markdownText")  # the style sheet draws its focus ring
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextBrowserInteraction | Qt.TextInteractionFlag.TextSelectableByKeyboard
        )
        self._markdown = ""
        self._highlighter = CodeHighlighter(self.document(), palette_is_dark(self.palette()))
        self._code: list[tuple[int, str]] = []  # each code block: (its first text block's number, its code)
        self.code_buttons: list[CopyButton] = []  # one per code block, made as needed and kept for reuse
        self.document().documentLayout().documentSizeChanged.connect(self._on_layout_changed)

    def markdown(self) -> str:
        """The source text last set (not Qt's re-export of it)."""
        return self._markdown

    def set_markdown(self, text: str) -> None:
        self._markdown = text
        render_markdown(self.document(), text)
        self._code = self._code_blocks_shown()
        while len(self.code_buttons) < len(self._code):
            self._make_code_button()
        self._format_code_blocks()
        self._order_code_buttons()
        self._fit_height()
        self._place_code_buttons()

    def code_blocks(self) -> list[str]:
        """The code of each fenced block, as written between its fences."""
        return [code for _number, code in self._code]

    def _code_blocks_shown(self) -> list[tuple[int, str]]:
        blocks: list[tuple[int, str]] = []
        lines: list[str] = []
        block = self.document().begin()
        while block.isValid():
            if _is_code(block):
                if not _is_code(block.previous()):
                    blocks.append((block.blockNumber(), ""))
                    lines = []
                lines.append(block.text())
                blocks[-1] = (blocks[-1][0], "\n".join(lines))
            block = block.next()
        return blocks

    def _format_code_blocks(self) -> None:
        # A light tint behind code, from the palette so it works in dark mode too; lines wrap rather than run
        # off the edge; the first line leaves room above it for the copy button.
        shade = QTextBlockFormat()
        shade.setBackground(self.palette().color(QPalette.ColorRole.AlternateBase))
        shade.setNonBreakableLines(False)
        first_line = QTextBlockFormat(shade)
        if self.code_buttons:
            first_line.setTopMargin(self.code_buttons[0].sizeHint().height() + 2)
        firsts = {number for number, _code in self._code}
        block = self.document().begin()
        cursor = QTextCursor(self.document())
        while block.isValid():
            if _is_code(block):
                cursor.setPosition(block.position())
                cursor.mergeBlockFormat(first_line if block.blockNumber() in firsts else shade)
            block = block.next()

    def _make_code_button(self) -> None:
        k = len(self.code_buttons)
        button = CopyButton(
            "Copy code", "Copy this code block (without its fences)", lambda: self.code_blocks()[k], self.viewport()
        )
        button.setObjectName("copyCodeButton")
        button.setCursor(Qt.CursorShape.ArrowCursor)
        self.code_buttons.append(button)

    def _order_code_buttons(self) -> None:
        previous: QWidget = self
        for k, button in enumerate(self.code_buttons):
            shown = k < len(self._code)
            button.setVisible(shown)
            if shown:
                QWidget.setTabOrder(previous, button)  # right after the text they belong to, in reading order
                previous = button

    def _place_code_buttons(self) -> None:
        layout = self.document().documentLayout()
        for (number, _code), button in zip(self._code, self.code_buttons, strict=False):
            # In the room the block's top margin left above its first line, flush with its right edge.
            rect = layout.blockBoundingRect(self.document().findBlockByNumber(number))
            size = button.sizeHint()
            x = min(round(rect.right()), self.viewport().width()) - size.width()
            button.setGeometry(max(0, x), max(0, round(rect.top()) - size.height() - 1), size.width(), size.height())

    @Slot()
    def _on_layout_changed(self) -> None:
        self._place_code_buttons()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        self._place_code_buttons()
