"""The right-hand panel: live stats, the Decoding box (``LookaheadControls``), sampling, model, system prompt."""

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
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine import LookaheadConfig, SamplingConfig, StepEvent, StopConfig
from engine.decoding.settings import (
    APP_LOOP_GUARD,
    MAX_DRY_MULTIPLIER,
    MAX_REPEAT_LAST_N,
    MAX_REPEAT_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
)

from ..settings import AppSettings
from .lookahead_controls import LookaheadControls, spin_box
from .section import Section
from .stats_view import LiveStatsView

# What a chat keeps of the panel (ChatStore.conversation_settings), by the names of SamplingConfig/StopConfig.
CHAT_SETTING_TYPES: dict[str, type] = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float, "repeat_penalty": float,
    "repeat_last_n": int, "dry_multiplier": float, "seed": int, "max_tokens": int, "stop_strings": list,
    "loop_guard": bool,
}

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
        live_box = self._build_live_box()
        self.lookahead = LookaheadControls()
        sampling_box = self._build_sampling_form()
        model_box = self._build_model_form()
        prompt_box = self._build_prompt_box()
        # The settings changed less often fold to a line saying what they are set to, so the live view and
        # the decoding switches fit a laptop's screen height without scrolling.
        self.sections = {
            "sampling": Section("Sampling", sampling_box, note="saved with the chat"),
            "model": Section("Model", model_box, note="applies on the next load"),
            "system_prompt": Section("System prompt", prompt_box, note="for this chat"),
        }

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(live_box, 1)
        layout.addWidget(self.lookahead)
        for section in self.sections.values():
            layout.addWidget(section)
            section.expandedChanged.connect(self._on_setting_changed)
        self._connect_controls()
        self._update_summaries()

    def _build_live_box(self) -> QGroupBox:
        self.live = LiveStatsView(self)
        live_box = QGroupBox("Live: tokens per forward pass")
        live_box.setToolTip("The reply being written, or the last one; hover a number for what it means")
        QVBoxLayout(live_box).addWidget(self.live)
        return live_box

    def _build_sampling_form(self) -> QWidget:
        """How tokens are picked and when a reply ends: the values a chat keeps."""
        self.temperature_spin = QDoubleSpinBox()
        self.temperature_spin.setRange(0.0, MAX_TEMPERATURE)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setSpecialValueText("0 (greedy)")
        self.top_k_spin = spin_box(0, MAX_TOP_K, "Sample from the k likeliest tokens only (sampling only)")
        self.top_k_spin.setSpecialValueText("off")
        self.top_p_spin = QDoubleSpinBox()
        self.top_p_spin.setRange(0.05, 1.0)
        self.top_p_spin.setSingleStep(0.05)
        self.top_p_spin.setToolTip("Sample from the likeliest tokens that together hold this probability")
        self.min_p_spin = fraction_box(0.0, 0.99, 0.01, "Drop tokens less likely than this fraction of the "
                                         "likeliest one (sampling only)")
        self.min_p_spin.setSpecialValueText("off")
        self.repeat_penalty_spin = fraction_box(1.0, MAX_REPEAT_PENALTY, 0.05, "Make tokens of the last N "
                                                  "tokens less likely; applies when greedy too")
        self.repeat_penalty_spin.setSpecialValueText("off")
        self.repeat_last_n_spin = spin_box(0, MAX_REPEAT_LAST_N, "How many recent tokens (the prompt's "
                                             "included) the repeat penalty looks at")
        self.repeat_last_n_spin.setSingleStep(16)
        self.repeat_last_n_spin.setSuffix(" tokens")
        self.repeat_last_n_spin.setSpecialValueText("off")
        self.dry_spin = fraction_box(0.0, MAX_DRY_MULTIPLIER, 0.1, DRY_TIP)
        self.dry_spin.setSpecialValueText("off")
        self.seed_spin = spin_box(0, 2**31 - 1, "Random seed (sampling only)")
        self.max_tokens_spin = spin_box(1, 32768, "Longest reply, in tokens")
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
        return sampling_box

    def _build_model_form(self) -> QWidget:
        """The context size and threads the next load uses, and Reload."""
        self.n_ctx_spin = spin_box(256, 131072, "Context size in tokens (applies on the next model load)")
        self.n_ctx_spin.setSingleStep(256)
        self.threads_spin = spin_box(0, max(1, os.cpu_count() or 1) * 2, "CPU threads (applies on the next load)")
        self.threads_spin.setSpecialValueText("auto")
        self.reload_button = QPushButton("Reload model")
        self.reload_button.setToolTip("Load the model again with this context size and thread count")
        model_box = QWidget()
        form = QFormLayout(model_box)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Context", self.n_ctx_spin)
        form.addRow("Threads", self.threads_spin)
        form.addRow(self.reload_button)
        return model_box

    def _build_prompt_box(self) -> QWidget:
        """The open chat's system prompt, and the button that makes it new chats' too."""
        self.system_prompt_edit = QPlainTextEdit()
        self.system_prompt_edit.setPlaceholderText("System prompt for this chat")
        self.system_prompt_edit.setMaximumHeight(self.fontMetrics().lineSpacing() * 4 + 14)
        self.default_prompt_button = QPushButton("Use for new chats")
        chat_box = QWidget()
        chat_layout = QVBoxLayout(chat_box)
        chat_layout.setContentsMargins(0, 0, 0, 0)
        chat_layout.addWidget(self.system_prompt_edit)
        chat_layout.addWidget(self.default_prompt_button)
        return chat_box

    def _connect_controls(self) -> None:
        self.lookahead.changed.connect(self._on_lookahead_controls_changed)
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

    # --- reading and writing the controls ---

    def load_settings(self, s: AppSettings) -> None:
        """Show ``s`` without emitting change signals."""
        self.lookahead.load(s)
        widgets = (self.n_ctx_spin, self.threads_spin)
        for w in widgets:
            w.blockSignals(True)
        try:
            self.n_ctx_spin.setValue(s.n_ctx)
            self.threads_spin.setValue(s.threads)
        finally:
            for w in widgets:
                w.blockSignals(False)
        for name, section in self.sections.items():
            section.set_expanded(name in s.open_panel_sections)
        self.load_chat_settings({name: getattr(s, name) for name in CHAT_SETTING_TYPES})
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
        self.lookahead.store(s)
        for name, value in self.chat_settings().items():
            setattr(s, name, value)
        s.n_ctx = self.n_ctx_spin.value()
        s.threads = self.threads_spin.value()
        s.open_panel_sections = [name for name, section in self.sections.items() if section.is_expanded()]

    def lookahead_config(self) -> LookaheadConfig | None:
        """The lookahead setting in effect; None = plain decoding (switched off or unavailable)."""
        return self.lookahead.config()

    def chosen_lookahead(self) -> LookaheadConfig:
        """Auto or the W/N/G set here, whether or not lookahead is switched on."""
        return self.lookahead.chosen()

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
        self.lookahead.set_blocked(reason, note)

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
        self.lookahead.show_step(event)

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


def fraction_box(low: float, high: float, step: float, tip: str) -> QDoubleSpinBox:
    """A spin box of fractions from ``low`` to ``high`` in steps of ``step`` that says what it sets."""
    spin = QDoubleSpinBox()
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setToolTip(tip)
    return spin


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
