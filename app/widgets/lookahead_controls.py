"""The decoding panel's Decoding box: lookahead on or off, Auto, and the W/N/G shape (under Auto, what it chose)."""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QCheckBox, QGroupBox, QHBoxLayout, QSpinBox, QStackedWidget, QVBoxLayout, QWidget

from engine import LookaheadConfig, StepEvent
from engine.decoding.settings import DEFAULT_LOOKAHEAD

from ..settings import AppSettings
from .plain import Label
from .plain import tip as plain_tip
from .stats_view import auto_step_text

# Engine limits (engine/decoding/settings.py): the spin boxes cannot leave them.
WINDOW_RANGE = (0, 16)
NGRAM_RANGE = (2, 8)
GUESSES_RANGE = (0, 16)

AUTO_TIP = (
    "The engine picks each step's shape itself: the draft (from this chat, the text being regenerated or\n"
    "earlier chats) and its length with the most tokens expected per unit of cost on this PC's measured step\n"
    "costs, or a plain step when no draft is worth it. W, N and G below are then not used (your values are kept\n"
    "for when Auto is off); the line in their place says what Auto chose for the last step."
)
AUTO_CHOICE_TIP = (
    "What Auto chose for the last step: W window columns, N n-gram size (or draft length + 1), G drafts\n"
    "checked. Hover after a step for Auto's reason."
)
WINDOW_TIP = (
    "Window W: Jacobi columns guessing ahead each step, their n-grams feeding the pool (0 = none). A wider\n"
    "window makes every step's batch bigger."
)
NGRAM_TIP = "N-gram size N: each guess checks N - 1 draft tokens, so a step can add up to N tokens"
GUESSES_TIP = "Guesses G: n-grams from the pool checked each step (0 = none; each adds N - 1 tokens to the batch)"


def spin_box(low: int, high: int, tip: str) -> QSpinBox:
    """A spin box from ``low`` to ``high`` that says what it sets."""
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setToolTip(tip)
    return spin


class LookaheadControls(QGroupBox):
    """Lookahead on or off, Auto, W/N/G, and why lookahead is off for a model that cannot do it.

    Signals:
        changed(): a control changed (``config()`` is the setting now in effect).
    """

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Decoding", parent)
        self._block_reason: str | None = None
        self._last_auto_step: StepEvent | None = None
        self.lookahead_check = QCheckBox("Lookahead decoding")
        self.lookahead_check.setToolTip("Guess several tokens ahead and verify them in the same forward pass")
        self.auto_check = QCheckBox("Auto (the engine picks W, N, G each step)")
        self.auto_check.setToolTip(AUTO_TIP)
        self.window_spin = spin_box(*WINDOW_RANGE, WINDOW_TIP)
        self.ngram_spin = spin_box(*NGRAM_RANGE, NGRAM_TIP)
        self.guesses_spin = spin_box(*GUESSES_RANGE, GUESSES_TIP)
        self.block_label = Label()
        self.block_label.setWordWrap(True)
        self.block_label.setVisible(False)
        self.manual_shape = QWidget()
        shape = QHBoxLayout(self.manual_shape)
        shape.setContentsMargins(0, 0, 0, 0)
        for name, spin in (("W", self.window_spin), ("N", self.ngram_spin), ("G", self.guesses_spin)):
            name_label = Label(name)
            name_label.setToolTip(spin.toolTip())
            shape.addWidget(name_label)
            shape.addWidget(spin, 1)
        # Under Auto the spin boxes give way to what Auto chose: greyed manual values there read as if in use.
        self.auto_choice = Label()
        self.auto_choice.setWordWrap(True)
        self.auto_choice.setToolTip(AUTO_CHOICE_TIP)
        self.shape_stack = QStackedWidget()
        self.shape_stack.addWidget(self.manual_shape)
        self.shape_stack.addWidget(self.auto_choice)
        layout = QVBoxLayout(self)
        for widget in (self.lookahead_check, self.auto_check, self.shape_stack, self.block_label):
            layout.addWidget(widget)
        for box in (self.lookahead_check, self.auto_check):
            box.toggled.connect(self._on_changed)
        for spin in (self.window_spin, self.ngram_spin, self.guesses_spin):
            spin.valueChanged.connect(self._on_changed)
        self._update_enabled()

    def load(self, s: AppSettings) -> None:
        """Show ``s``' lookahead settings without emitting ``changed``."""
        widgets = (self.lookahead_check, self.auto_check, self.window_spin, self.ngram_spin, self.guesses_spin)
        for w in widgets:
            w.blockSignals(True)
        try:
            self.lookahead_check.setChecked(s.lookahead_on)
            self.auto_check.setChecked(s.auto)
            self.window_spin.setValue(s.window)
            self.ngram_spin.setValue(s.ngram)
            self.guesses_spin.setValue(s.guesses)
        finally:
            for w in widgets:
                w.blockSignals(False)
        self._update_enabled()

    def store(self, s: AppSettings) -> None:
        s.lookahead_on = self.lookahead_check.isChecked()
        s.auto = self.auto_check.isChecked()
        s.window, s.ngram, s.guesses = self.window_spin.value(), self.ngram_spin.value(), self.guesses_spin.value()

    def config(self) -> LookaheadConfig | None:
        """The lookahead setting in effect; None = plain decoding (switched off or unavailable)."""
        if self._block_reason or not self.lookahead_check.isChecked():
            return None
        return self.chosen()

    def chosen(self) -> LookaheadConfig:
        """Auto or the W/N/G set here, whether or not lookahead is switched on."""
        if self.auto_check.isChecked():
            return DEFAULT_LOOKAHEAD  # Auto chooses each step within these limits
        return LookaheadConfig(
            window=self.window_spin.value(),
            ngram=self.ngram_spin.value(),
            guesses=self.guesses_spin.value(),
        )

    def set_blocked(self, reason: str | None, note: str = "") -> None:
        """Disable lookahead for a model that cannot do it, saying why; ``note``: what this model's lookahead
        leaves out (shown while it is not blocked)."""
        self._block_reason = reason
        text = reason or note
        self.block_label.setText(text)
        self.block_label.setVisible(bool(text))
        self._update_enabled()

    def show_step(self, event: StepEvent) -> None:
        """A step of the running reply: an Auto step's shape goes where W, N, G are shown under Auto."""
        if event.mode == "auto":
            self._last_auto_step = event
            self._show_auto_choice()

    def _show_auto_choice(self) -> None:
        ev = self._last_auto_step
        if ev is None:
            self.auto_choice.setText("W, N, G: set by Auto each step (no step yet)")
            self.auto_choice.setToolTip(AUTO_CHOICE_TIP)
            return
        shape = f"W{ev.window} N{ev.ngram} G{ev.guesses}, " if ev.n_drafted or ev.window else ""
        self.auto_choice.setText(f"W, N, G: set by Auto each step. Last step: {shape}{auto_step_text(ev)}")
        why = f"\n\nWhy: {ev.choice}" if ev.choice else ""
        self.auto_choice.setToolTip(plain_tip(AUTO_CHOICE_TIP + why))

    def _update_enabled(self) -> None:
        available = self._block_reason is None
        on = available and self.lookahead_check.isChecked()
        self.lookahead_check.setEnabled(available)
        self.auto_check.setEnabled(on)
        auto = self.auto_check.isChecked()
        for spin in (self.window_spin, self.ngram_spin, self.guesses_spin):
            spin.setEnabled(on and not auto)
        # The manual values stay in their spin boxes (saved settings), out of sight while Auto sets the shape.
        self.shape_stack.setCurrentWidget(self.auto_choice if auto else self.manual_shape)
        self.auto_choice.setEnabled(on)
        self._show_auto_choice()

    @Slot()
    def _on_changed(self) -> None:
        self._update_enabled()
        self.changed.emit()
