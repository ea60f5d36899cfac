"""A titled part of a side panel that folds away to one line saying what it holds."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from .context_meter import ElidingLabel


class Section(QWidget):
    """A header button (click, or Space when focused, folds and unfolds) above a body.

    Folded, the header shows the summary beside the title (greyed, shortened with "…" when there is no
    room, whole in its tooltip), so what the folded controls are set to stays in sight; unfolded, it shows
    ``note`` there (what the controls apply to).

    Signals:
        expandedChanged(bool): the user folded or unfolded the section.
    """

    expandedChanged = Signal(bool)

    def __init__(
        self, title: str, body: QWidget, note: str = "", expanded: bool = True, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._note = note
        self._summary = ""
        self.header = QToolButton()
        self.header.setText(title)
        self.header.setCheckable(True)
        self.header.setAutoRaise(True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.header.setIconSize(QSize(10, 10))
        font = self.header.font()
        font.setBold(True)
        self.header.setFont(font)
        self.summary = ElidingLabel()
        self.summary.setEnabled(False)  # the palette's disabled text: quieter than the controls' own
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        header_row = QHBoxLayout()
        header_row.setContentsMargins(0, 0, 0, 0)
        header_row.addWidget(self.header)
        header_row.addWidget(self.summary, 1)

        self.body = QFrame()
        self.body.setFrameShape(QFrame.Shape.StyledPanel)
        body_layout = QVBoxLayout(self.body)
        body_layout.setContentsMargins(6, 6, 6, 6)
        body_layout.addWidget(body)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(header_row)
        layout.addWidget(self.body)

        self.header.setChecked(expanded)
        self._show_state(expanded)
        self.header.toggled.connect(self._on_toggled)

    def is_expanded(self) -> bool:
        return self.header.isChecked()

    def set_expanded(self, on: bool) -> None:
        """Fold or unfold without emitting ``expandedChanged`` (a saved state being shown)."""
        self.header.blockSignals(True)
        self.header.setChecked(on)
        self.header.blockSignals(False)
        self._show_state(on)

    def set_summary(self, text: str) -> None:
        self._summary = text
        self._show_state(self.is_expanded())

    def summary_text(self) -> str:
        return self._summary

    def _show_state(self, expanded: bool) -> None:
        self.header.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.header.setToolTip("Fold this section" if expanded else "Show this section")
        self.body.setVisible(expanded)
        self.summary.set_full_text(self._note if expanded else self._summary)
        self.summary.setVisible(bool(self.summary.full_text()))

    @Slot(bool)
    def _on_toggled(self, on: bool) -> None:
        self._show_state(on)
        self.expandedChanged.emit(on)
