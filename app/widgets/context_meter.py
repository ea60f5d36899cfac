"""How much of the model's context the open chat fills: tokens used of the context size, the system prompt's share."""

from __future__ import annotations

import math
from collections.abc import Mapping

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QPalette, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget

from .plain import Label
from .plain import tip as plain_tip

# At this share of the context the meter turns to the warning colour: the next turns will push out old ones.
WARN_AT = 0.85


class ElidingLabel(QLabel):
    """One line that ends in "…" when it has too little room; then the whole text is its tooltip.

    ``full_text()`` is the text as set; ``text()`` is what is shown.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self._more = ""  # said in the tooltip after the text, elided or not
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

    def set_full_text(self, text: str) -> None:
        self._full = text
        self.updateGeometry()
        self._elide()

    def full_text(self) -> str:
        return self._full

    def set_tooltip_extra(self, extra: str) -> None:
        """More than the line has room for, said in its tooltip after the text (e.g. " · files: a.pdf 100%")."""
        self._more = extra
        self._elide()

    def is_elided(self) -> bool:
        return self.text() != self._full

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt name)
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 2, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt name)
        return QSize(self.fontMetrics().horizontalAdvance("0…") + 2, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        self._elide()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt name)
        super().showEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self._full
        if self.isVisible():  # laid out: its width is real (a hidden label keeps its whole text)
            shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, self.width())
        self.setText(shown)
        self.setToolTip(plain_tip(self._full + self._more if shown != self._full or self._more else ""))


class ContextMeter(QWidget):
    """A bar and a line: ``1,234 / 4,096 tokens · system 45``; warns near the end of the context."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(8)
        self.bar.setMaximumWidth(220)
        self.bar.setMinimumWidth(40)  # in a narrow chat the bar gives way first, then the line is shortened
        self.label = ElidingLabel()
        self.label.setEnabled(False)  # a quiet line, like the stats lines
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addStretch(1)
        layout.addWidget(Label("Context"))
        layout.addWidget(self.bar, 1)
        layout.addWidget(self.label, 4)
        self._normal = self.bar.palette()
        self.n_ctx = 0
        self.used: int | None = None
        self.system = 0
        self.warning = False
        self.documents: dict[str, float] = {}
        self._show()

    def set_context(self, n_ctx: int) -> None:
        """The context size of the model in use."""
        self.n_ctx = n_ctx
        self._show()

    def set_usage(self, used: int | None, system: int = 0) -> None:
        """Tokens the chat fills (None: not known, e.g. a chat from before this was counted)."""
        self.used, self.system = used, system
        self._show()

    def set_documents(self, coverage: Mapping[str, float]) -> None:
        """How much of each attached file the model sees ({name: 0..1}; empty: no files), said in the tooltips."""
        self.documents = dict(coverage)
        self._show()

    def documents_text(self) -> str:
        """" · files: manual.pdf 100%, big.txt 12%" ("" without files); a share is never rounded up to 100%."""
        if not self.documents:
            return ""
        return " · files: " + ", ".join(f"{name} {_percent(share)}" for name, share in self.documents.items())

    def _show(self) -> None:
        n_ctx, used = self.n_ctx, self.used
        self.bar.setMaximum(max(n_ctx, 1))
        self.bar.setValue(min(used or 0, max(n_ctx, 1)))
        if not n_ctx:
            self.label.set_full_text("no model")
        elif used is None:
            self.label.set_full_text(f"– / {n_ctx:,} tokens")
        else:
            text = f"{used:,} / {n_ctx:,} tokens"
            if self.system:
                text += f" · system {self.system:,}"
            self.label.set_full_text(text)
        self.warning = bool(n_ctx and used is not None and used >= WARN_AT * n_ctx)
        palette = QPalette(self._normal)
        if self.warning:
            palette.setColor(QPalette.ColorRole.Highlight, QColor("#d9822b"))
        self.bar.setPalette(palette)
        tip = (
            "How much of the model's context this chat fills: its messages (with the system prompt's share) "
            "and the reply so far."
        )
        if self.warning:
            tip += " Near the end: the next turns will leave the oldest messages out of what the model sees."
        files = self.documents_text()
        if files:
            tip += "\nAttached files, the share of each the model sees" + files.replace(" · files", "")
        self.setToolTip(plain_tip(tip))
        self.label.set_tooltip_extra(files)


def _percent(share: float) -> str:
    if 0 < share < 0.01:
        return "<1%"
    return f"{math.floor(share * 100 + 1e-9)}%"
