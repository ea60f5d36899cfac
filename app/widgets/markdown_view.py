"""Markdown rendered by Qt, with fenced code coloured by Pygments."""

from __future__ import annotations

import math
from functools import lru_cache

from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtCore import QSize, Qt, Slot
from PySide6.QtGui import (
    QColor,
    QFont,
    QGuiApplication,
    QPalette,
    QResizeEvent,
    QSyntaxHighlighter,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QSizePolicy, QTextBrowser, QWidget

_CODE_LANGUAGE = QTextFormat.Property.BlockCodeLanguage


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


class CodeHighlighter(QSyntaxHighlighter):
    """Colours the code blocks Qt's Markdown reader marks with a language.

    Qt keeps each line of a fenced block as its own text block; the whole fence
    is lexed at once (and cached) so multi-line strings and comments come out right.
    """

    def __init__(self, document: QTextDocument, dark: bool) -> None:
        super().__init__(document)
        # Foreground colours only: the background stays the palette's.
        self._style = get_style_by_name("monokai" if dark else "default")
        self._formats: dict[object, QTextCharFormat] = {}

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

    def highlightBlock(self, text: str) -> None:
        block = self.currentBlock()
        if not _is_code(block):
            return
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
        self.viewport().setAutoFillBackground(False)
        self.document().documentLayout().documentSizeChanged.connect(self._on_document_size_changed)

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
    """Markdown, with fenced code coloured."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextBrowserInteraction | Qt.TextInteractionFlag.TextSelectableByKeyboard
        )
        self._markdown = ""
        self._highlighter = CodeHighlighter(self.document(), palette_is_dark(self.palette()))

    def markdown(self) -> str:
        """The source text last set (not Qt's re-export of it)."""
        return self._markdown

    def set_markdown(self, text: str) -> None:
        self._markdown = text
        self.setMarkdown(keep_line_breaks(text))
        self._shade_code_blocks()
        self._fit_height()

    def _shade_code_blocks(self) -> None:
        # A light tint behind code, from the palette so it works in dark mode too.
        shade = QTextBlockFormat()
        shade.setBackground(self.palette().color(QPalette.ColorRole.AlternateBase))
        block = self.document().begin()
        cursor = QTextCursor(self.document())
        while block.isValid():
            if _is_code(block):
                cursor.setPosition(block.position())
                cursor.mergeBlockFormat(shade)
            block = block.next()

