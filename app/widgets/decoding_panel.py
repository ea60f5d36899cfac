"""The right-hand panel: live stats, lookahead shape, sampling, model options, system prompt."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine import LookaheadConfig, SamplingConfig, StepEvent, StopConfig
from engine.decoding.settings import (
    APP_LOOP_GUARD,
    DEFAULT_LOOKAHEAD,
    MAX_DRY_MULTIPLIER,
    MAX_REPEAT_LAST_N,
    MAX_REPEAT_PENALTY,
    MAX_TOP_K,
)

from ..settings import AppSettings
from .plain import Label
from .plain import tip as plain_tip
from .section import Section
from .stats_view import LiveStatsView, auto_step_text

# Engine limits (engine/decoding/settings.py): the spin boxes cannot leave them.
WINDOW_RANGE = (0, 16)
NGRAM_RANGE = (2, 8)
GUESSES_RANGE = (0, 16)

# What a chat keeps of the panel (ChatStore.conversation_settings), by the names of SamplingConfig/StopConfig.
CHAT_SETTING_TYPES: dict[str, type] = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float, "repeat_penalty": float,
    "repeat_last_n": int, "dry_multiplier": float, "seed": int, "max_tokens": int, "stop_strings": list,
    "loop_guard": bool,
}

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

LOOP_GUARD_TIP = (
    "End the reply when it starts repeating one passage over and over, as small models can; repeating what the "
    "message or an attached file holds is not stopped. Plain decoding and lookahead stop at the same word."
)
DRY_TIP = (
    "Don't repeat yourself: make a token less likely the longer the run of the reply's own earlier text it would "
    "extend (0.8 is llama.cpp's usual strength; off = 0). Copying the prompt or a document is not penalised. "
    "Applies when greedy too"
)
STOP_STRINGS_TIP = (
    "The reply ends before any of these texts. One per line; write \\n for a line break, "
    "\\t for a tab and \\\\ for a backslash."
)


class DecodingPanel(QWidget):
    """Controls for how replies are decoded, and the live view of the running one.

    Signals:
        lookaheadChanged(object): the lookahead setting now in effect (``LookaheadConfig`` or None).
        settingsChanged(): any control changed (the owner persists them).
        systemPromptEdited(str): the open chat's system prompt was edited.
        makeDefaultPromptRequested(str): use this system prompt for new chats.
        reloadRequested(): reload the model with the new context size / threads.
    """

    lookaheadChanged = Signal(object)
    settingsChanged = Signal()
    systemPromptEdited = Signal(str)
    makeDefaultPromptRequested = Signal(str)
    reloadRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._block_reason: str | None = None

        self.live = LiveStatsView(self)
        live_box = QGroupBox("Live: tokens per forward pass")
        live_box.setToolTip("The reply being written, or the last one; hover a number for what it means")
        QVBoxLayout(live_box).addWidget(self.live)

        # --- lookahead ---
        self.lookahead_check = QCheckBox("Lookahead decoding")
        self.lookahead_check.setToolTip("Guess several tokens ahead and verify them in the same forward pass")
        self.auto_check = QCheckBox("Auto (the engine picks W, N, G each step)")
        self.auto_check.setToolTip(AUTO_TIP)
        self.window_spin = self._spin(*WINDOW_RANGE, WINDOW_TIP)
        self.ngram_spin = self._spin(*NGRAM_RANGE, NGRAM_TIP)
        self.guesses_spin = self._spin(*GUESSES_RANGE, GUESSES_TIP)
        self.block_label = Label()
        self.block_label.setWordWrap(True)
        self.block_label.setVisible(False)
        manual_shape = QWidget()
        shape = QHBoxLayout(manual_shape)
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
        self._last_auto_step: StepEvent | None = None
        self.manual_shape = manual_shape
        self.shape_stack = QStackedWidget()
        self.shape_stack.addWidget(manual_shape)
        self.shape_stack.addWidget(self.auto_choice)
        la_box = QGroupBox("Decoding")
        la_layout = QVBoxLayout(la_box)
        la_layout.addWidget(self.lookahead_check)
        la_layout.addWidget(self.auto_check)
        la_layout.addWidget(self.shape_stack)
        la_layout.addWidget(self.block_label)

        # --- sampling ---
        self.temperature_spin = QDoubleSpinBox()
        self.temperature_spin.setRange(0.0, 2.0)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setSpecialValueText("0 (greedy)")
        self.top_k_spin = self._spin(0, MAX_TOP_K, "Sample from the k likeliest tokens only (sampling only)")
        self.top_k_spin.setSpecialValueText("off")
        self.top_p_spin = QDoubleSpinBox()
        self.top_p_spin.setRange(0.05, 1.0)
        self.top_p_spin.setSingleStep(0.05)
        self.top_p_spin.setToolTip("Sample from the likeliest tokens that together hold this probability")
        self.min_p_spin = self._fraction(0.0, 0.99, 0.01, "Drop tokens less likely than this fraction of the "
                                         "likeliest one (sampling only)")
        self.min_p_spin.setSpecialValueText("off")
        self.repeat_penalty_spin = self._fraction(1.0, MAX_REPEAT_PENALTY, 0.05, "Make tokens of the last N "
                                                  "tokens less likely; applies when greedy too")
        self.repeat_penalty_spin.setSpecialValueText("off")
        self.repeat_last_n_spin = self._spin(0, MAX_REPEAT_LAST_N, "How many recent tokens (the prompt's "
                                             "included) the repeat penalty looks at")
        self.repeat_last_n_spin.setSingleStep(16)
        self.repeat_last_n_spin.setSuffix(" tokens")
        self.repeat_last_n_spin.setSpecialValueText("off")
        self.dry_spin = self._fraction(0.0, MAX_DRY_MULTIPLIER, 0.1, DRY_TIP)
        self.dry_spin.setSpecialValueText("off")
        self.seed_spin = self._spin(0, 2**31 - 1, "Random seed (sampling only)")
        self.max_tokens_spin = self._spin(1, 32768, "Longest reply, in tokens")
        self.stop_edit = QPlainTextEdit()
        self.stop_edit.setPlaceholderText("One per line, e.g. ###")
        self.stop_edit.setToolTip(STOP_STRINGS_TIP)
        self.stop_edit.setTabChangesFocus(True)
        self.stop_edit.setMaximumHeight(self.fontMetrics().lineSpacing() * 3 + 14)
        self.loop_guard_check = QCheckBox("Stop a reply that repeats itself")
        self.loop_guard_check.setToolTip(LOOP_GUARD_TIP)
        self.loop_guard_check.setChecked(APP_LOOP_GUARD)  # as AppSettings, until the user says otherwise
        sampling_box = QWidget()
        form = QFormLayout(sampling_box)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Temperature", self.temperature_spin)
        form.addRow("Top-k", self.top_k_spin)
        form.addRow("Top-p", self.top_p_spin)
        form.addRow("Min-p", self.min_p_spin)
        form.addRow("Repeat penalty", self.repeat_penalty_spin)
        form.addRow("Penalty window", self.repeat_last_n_spin)
        form.addRow("Don't repeat (DRY)", self.dry_spin)
        form.addRow("Seed", self.seed_spin)
        form.addRow("Max tokens", self.max_tokens_spin)
        form.addRow("Stop strings", self.stop_edit)
        form.addRow("", self.loop_guard_check)

        # --- model ---
        self.n_ctx_spin = self._spin(256, 131072, "Context size in tokens (applies on the next model load)")
        self.n_ctx_spin.setSingleStep(256)
        self.threads_spin = self._spin(0, max(1, os.cpu_count() or 1) * 2, "CPU threads (applies on the next load)")
        self.threads_spin.setSpecialValueText("auto")
        self.reload_button = QPushButton("Reload model")
        self.reload_button.setToolTip("Load the model again with this context size and thread count")
        model_box = QWidget()
        form = QFormLayout(model_box)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Context", self.n_ctx_spin)
        form.addRow("Threads", self.threads_spin)
        form.addRow(self.reload_button)

        # --- chat ---
        self.system_prompt_edit = QPlainTextEdit()
        self.system_prompt_edit.setPlaceholderText("System prompt for this chat")
        self.system_prompt_edit.setMaximumHeight(self.fontMetrics().lineSpacing() * 4 + 14)
        self.default_prompt_button = QPushButton("Use for new chats")
        chat_box = QWidget()
        chat_layout = QVBoxLayout(chat_box)
        chat_layout.setContentsMargins(0, 0, 0, 0)
        chat_layout.addWidget(self.system_prompt_edit)
        chat_layout.addWidget(self.default_prompt_button)

        # The settings changed less often fold to a line saying what they are set to, so the live view and
        # the decoding switches fit a laptop's screen height without scrolling.
        self.sections = {
            "sampling": Section("Sampling", sampling_box, note="saved with the chat"),
            "model": Section("Model", model_box, note="applies on the next load"),
            "system_prompt": Section("System prompt", chat_box, note="for this chat"),
        }

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(live_box, 1)
        layout.addWidget(la_box)
        for section in self.sections.values():
            layout.addWidget(section)
            section.expandedChanged.connect(self._on_setting_changed)

        for box in (self.lookahead_check, self.auto_check):
            box.toggled.connect(self._on_lookahead_controls_changed)
        for spin in (self.window_spin, self.ngram_spin, self.guesses_spin):
            spin.valueChanged.connect(self._on_lookahead_controls_changed)
        for fraction in (self.temperature_spin, self.top_p_spin, self.min_p_spin, self.repeat_penalty_spin,
                         self.dry_spin):
            fraction.valueChanged.connect(self._on_setting_changed)
        for spin in (self.top_k_spin, self.repeat_last_n_spin, self.seed_spin, self.max_tokens_spin,
                     self.n_ctx_spin, self.threads_spin):
            spin.valueChanged.connect(self._on_setting_changed)
        self.stop_edit.textChanged.connect(self._on_setting_changed)
        self.loop_guard_check.toggled.connect(self._on_setting_changed)
        self.reload_button.clicked.connect(self.reloadRequested)
        self.system_prompt_edit.textChanged.connect(self._on_system_prompt_changed)
        self.default_prompt_button.clicked.connect(self._on_make_default_prompt)
        self.settingsChanged.connect(self._update_summaries)
        self.system_prompt_edit.textChanged.connect(self._update_summaries)
        self._update_enabled()
        self._update_summaries()

    @staticmethod
    def _spin(low: int, high: int, tip: str) -> QSpinBox:
        spin = QSpinBox()
        spin.setRange(low, high)
        spin.setToolTip(tip)
        return spin

    @staticmethod
    def _fraction(low: float, high: float, step: float, tip: str) -> QDoubleSpinBox:
        spin = QDoubleSpinBox()
        spin.setRange(low, high)
        spin.setSingleStep(step)
        spin.setToolTip(tip)
        return spin

    # --- reading and writing the controls ---

    def load_settings(self, s: AppSettings) -> None:
        """Show ``s`` without emitting change signals."""
        widgets = (
            self.lookahead_check, self.auto_check, self.window_spin, self.ngram_spin, self.guesses_spin,
            self.n_ctx_spin, self.threads_spin,
        )
        for w in widgets:
            w.blockSignals(True)
        try:
            self.lookahead_check.setChecked(s.lookahead_on)
            self.auto_check.setChecked(s.auto)
            self.window_spin.setValue(s.window)
            self.ngram_spin.setValue(s.ngram)
            self.guesses_spin.setValue(s.guesses)
            self.n_ctx_spin.setValue(s.n_ctx)
            self.threads_spin.setValue(s.threads)
        finally:
            for w in widgets:
                w.blockSignals(False)
        for name, section in self.sections.items():
            section.set_expanded(name in s.open_panel_sections)
        self.load_chat_settings({name: getattr(s, name) for name in CHAT_SETTING_TYPES})
        self._update_enabled()
        self._update_summaries()

    def load_chat_settings(self, values: Mapping[str, Any]) -> None:
        """Show the sampling values a chat was saved with, without emitting change signals.

        Missing names and values of the wrong type keep what the panel shows (older
        chats saved none); values out of range are clamped by the spin boxes.
        """
        valid = {
            name: value for name, value in values.items()
            if name in CHAT_SETTING_TYPES and _is_a(value, CHAT_SETTING_TYPES[name])
        }
        spins: dict[str, QSpinBox | QDoubleSpinBox] = {
            "temperature": self.temperature_spin, "top_k": self.top_k_spin, "top_p": self.top_p_spin,
            "min_p": self.min_p_spin, "repeat_penalty": self.repeat_penalty_spin,
            "repeat_last_n": self.repeat_last_n_spin, "dry_multiplier": self.dry_spin, "seed": self.seed_spin,
            "max_tokens": self.max_tokens_spin,
        }
        widgets = (*spins.values(), self.stop_edit, self.loop_guard_check)
        for w in widgets:
            w.blockSignals(True)
        try:
            for name, spin in spins.items():
                if name in valid:
                    spin.setValue(valid[name])
            if "stop_strings" in valid:
                stops = [x for x in valid["stop_strings"] if isinstance(x, str)]
                self.stop_edit.setPlainText(format_stop_strings(stops))
            if "loop_guard" in valid:
                self.loop_guard_check.setChecked(valid["loop_guard"])
        finally:
            for w in widgets:
                w.blockSignals(False)
        self._update_summaries()

    def chat_settings(self) -> dict[str, Any]:
        """The sampling values to save with a chat (what ``load_chat_settings`` reads back)."""
        sampling, stop = self.sampling_config(), self.stop_config()
        return {
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty,
            "repeat_last_n": sampling.repeat_last_n, "dry_multiplier": sampling.dry_multiplier, "seed": sampling.seed,
            "max_tokens": stop.max_tokens,
            "stop_strings": list(stop.stop_strings), "loop_guard": stop.loop_guard,
        }

    def store_settings(self, s: AppSettings) -> None:
        s.lookahead_on = self.lookahead_check.isChecked()
        s.auto = self.auto_check.isChecked()
        s.window, s.ngram, s.guesses = self.window_spin.value(), self.ngram_spin.value(), self.guesses_spin.value()
        for name, value in self.chat_settings().items():
            setattr(s, name, value)
        s.n_ctx = self.n_ctx_spin.value()
        s.threads = self.threads_spin.value()
        s.open_panel_sections = [name for name, section in self.sections.items() if section.is_expanded()]

    def lookahead_config(self) -> LookaheadConfig | None:
        """The lookahead setting in effect; None = plain decoding (switched off or unavailable)."""
        if self._block_reason or not self.lookahead_check.isChecked():
            return None
        return self.chosen_lookahead()

    def chosen_lookahead(self) -> LookaheadConfig:
        """Auto or the W/N/G set here, whether or not lookahead is switched on."""
        if self.auto_check.isChecked():
            return DEFAULT_LOOKAHEAD  # Auto chooses each step within these limits
        return LookaheadConfig(
            window=self.window_spin.value(),
            ngram=self.ngram_spin.value(),
            guesses=self.guesses_spin.value(),
        )

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=round(self.temperature_spin.value(), 2),
            top_k=self.top_k_spin.value(),
            top_p=round(self.top_p_spin.value(), 2),
            min_p=round(self.min_p_spin.value(), 2),
            seed=self.seed_spin.value(),
            repeat_penalty=round(self.repeat_penalty_spin.value(), 2),
            repeat_last_n=self.repeat_last_n_spin.value(),
            dry_multiplier=round(self.dry_spin.value(), 2),
        )

    def stop_config(self) -> StopConfig:
        return StopConfig(
            max_tokens=self.max_tokens_spin.value(),
            stop_strings=tuple(parse_stop_strings(self.stop_edit.toPlainText())),
            loop_guard=self.loop_guard_check.isChecked(),
        )

    def set_lookahead_blocked(self, reason: str | None, note: str = "") -> None:
        """Disable lookahead for a model that cannot do it, saying why; ``note``: what this model's lookahead
        leaves out (shown while it is not blocked)."""
        self._block_reason = reason
        text = reason or note
        self.block_label.setText(text)
        self.block_label.setVisible(bool(text))
        self._update_enabled()

    def set_system_prompt(self, text: str) -> None:
        """Show the open chat's system prompt (without emitting systemPromptEdited)."""
        self.system_prompt_edit.blockSignals(True)
        self.system_prompt_edit.setPlainText(text)
        self.system_prompt_edit.blockSignals(False)
        self._update_summaries()

    def system_prompt(self) -> str:
        return self.system_prompt_edit.toPlainText()

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
    def _update_summaries(self) -> None:
        """What each folded section is set to, on its header line."""
        sampling, stop = self.sampling_config(), self.stop_config()
        self.sections["sampling"].set_summary(sampling_summary(sampling, stop))
        threads = self.threads_spin.value()
        self.sections["model"].set_summary(
            f"context {self.n_ctx_spin.value():,} · threads {threads if threads else 'auto'}"
        )
        prompt = " ".join(self.system_prompt().split())
        self.sections["system_prompt"].set_summary(prompt or "none")

    # --- slots ---

    @Slot()
    def _on_lookahead_controls_changed(self) -> None:
        self._update_enabled()
        self.lookaheadChanged.emit(self.lookahead_config())
        self.settingsChanged.emit()

    @Slot()
    def _on_setting_changed(self) -> None:
        self.settingsChanged.emit()

    @Slot()
    def _on_system_prompt_changed(self) -> None:
        self.systemPromptEdited.emit(self.system_prompt())

    @Slot()
    def _on_make_default_prompt(self) -> None:
        self.makeDefaultPromptRequested.emit(self.system_prompt())


def sampling_summary(sampling: SamplingConfig, stop: StopConfig) -> str:
    """One line for the folded Sampling section: how tokens are picked, the reply's limit, what stops it."""
    if sampling.temperature <= 0:
        parts = ["greedy"]
    else:
        parts = [f"temperature {sampling.temperature:g}"]
        if sampling.top_k:
            parts.append(f"top-k {sampling.top_k}")
        if sampling.top_p < 1:
            parts.append(f"top-p {sampling.top_p:g}")
        if sampling.min_p > 0:
            parts.append(f"min-p {sampling.min_p:g}")
    if sampling.repeat_penalty > 1 and sampling.repeat_last_n:
        parts.append(f"repeat penalty {sampling.repeat_penalty:g}")
    if sampling.dry:
        parts.append(f"DRY {sampling.dry_multiplier:g}")
    parts.append(f"up to {stop.max_tokens:,} tokens")
    if stop.stop_strings:
        n = len(stop.stop_strings)
        parts.append(f"{n} stop string{'s' if n > 1 else ''}")
    if not stop.loop_guard:
        parts.append("loops not stopped")
    return " · ".join(parts)


def _is_a(value: object, kind: type) -> bool:
    """``value`` fits a setting of type ``kind`` (an int does for a float; a bool or NaN never does for a number)."""
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
_ESCAPE = re.compile(r"\\([nt\\])")


def parse_stop_strings(text: str) -> list[str]:
    """The stop strings typed one per line, with ``\\n``, ``\\t`` and ``\\\\`` read as escapes."""
    lines = (_ESCAPE.sub(lambda m: _ESCAPES[m.group(1)], line) for line in text.splitlines())
    return [line for line in lines if line]


def format_stop_strings(stops: list[str]) -> str:
    """The inverse of ``parse_stop_strings``: one string per line, escaped."""
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in stops)
