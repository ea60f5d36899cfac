"""The decoding panel's foldable sections: what they say folded, how they open, and that the panel then fits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt

from app.settings import AppSettings
from app.widgets.decoding_panel import DecodingPanel, sampling_summary
from engine import SamplingConfig, StopConfig
from engine.decoding.settings import APP_SAMPLING
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine

pytestmark = [OFFSCREEN_NOISE]


@pytest.fixture
def fake_engine(worker_options: dict) -> None:
    use_fake_engine(worker_options, lambda engine: SimpleNamespace())


def test_a_folded_section_says_what_its_controls_are_set_to_and_follows_them(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    panel.load_settings(AppSettings(temperature=0.0, max_tokens=512, n_ctx=4096, threads=0,
                                    system_prompt="You are terse."))
    panel.set_system_prompt("You are terse.\nAnswer in one line.")
    panel.resize(420, 900)
    panel.show()
    qtbot.waitExposed(panel)
    sampling, model, prompt = (panel.sections[n] for n in ("sampling", "model", "system_prompt"))

    assert not sampling.is_expanded() and not sampling.body.isVisible()
    assert sampling.summary_text() == "greedy · DRY 0.8 · up to 512 tokens"
    assert model.summary_text() == "context 4,096 · threads auto"
    assert prompt.summary_text() == "You are terse. Answer in one line."

    panel.temperature_spin.setValue(0.7)
    panel.max_tokens_spin.setValue(2048)
    panel.stop_edit.setPlainText("###\nUser:")
    panel.threads_spin.setValue(2)
    assert sampling.summary_text() == (
        "temperature 0.7 · top-k 40 · top-p 0.95 · min-p 0.05 · DRY 0.8 · up to 2,048 tokens · 2 stop strings"
    )
    assert model.summary_text() == "context 4,096 · threads 2"

    panel.load_chat_settings({"temperature": 0.0, "max_tokens": 64, "stop_strings": []})  # another chat opened
    assert sampling.summary_text() == "greedy · DRY 0.8 · up to 64 tokens"


def test_the_summary_names_a_repeat_penalty_only_when_it_applies():
    on = SamplingConfig(temperature=0.0, repeat_penalty=1.1, repeat_last_n=64)
    off = SamplingConfig(temperature=0.0, repeat_penalty=1.1, repeat_last_n=0)
    guarded = StopConfig(max_tokens=10, loop_guard=True)
    assert sampling_summary(on, guarded) == "greedy · repeat penalty 1.1 · up to 10 tokens"
    assert sampling_summary(off, guarded) == "greedy · up to 10 tokens"


def test_dry_is_on_by_default_and_its_box_goes_into_the_sampling_and_the_chats(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    panel.load_settings(AppSettings())
    assert panel.sampling_config().dry_multiplier == 0.8 and panel.sampling_config() == APP_SAMPLING
    panel.dry_spin.setValue(0.0)
    assert not panel.sampling_config().dry and "DRY" not in panel.sections["sampling"].summary_text()
    saved = panel.chat_settings()
    assert saved["dry_multiplier"] == 0.0
    panel.load_chat_settings({"dry_multiplier": 1.5})
    assert panel.sampling_config().dry_multiplier == 1.5
    stored = AppSettings()
    panel.store_settings(stored)
    assert stored.dry_multiplier == 1.5


def test_the_loop_guard_is_on_by_default_and_its_switch_goes_into_the_stop_settings_and_the_chats(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    panel.load_settings(AppSettings())
    assert panel.loop_guard_check.isChecked() and panel.stop_config().loop_guard
    sampling = panel.sections["sampling"]

    panel.loop_guard_check.setChecked(False)
    assert not panel.stop_config().loop_guard
    assert sampling.summary_text() == "greedy · DRY 0.8 · up to 512 tokens · loops not stopped"
    saved = panel.chat_settings()
    assert saved["loop_guard"] is False

    panel.load_chat_settings({"loop_guard": True})  # another chat, saved with the guard on
    assert panel.stop_config().loop_guard
    panel.load_chat_settings({"loop_guard": 1})  # a wrong type keeps what the panel shows
    assert panel.stop_config().loop_guard
    panel.load_chat_settings(saved)
    assert not panel.stop_config().loop_guard
    stored = AppSettings()
    panel.store_settings(stored)
    assert stored.loop_guard is False


def test_the_header_unfolds_by_click_and_by_keyboard_and_says_what_the_open_controls_apply_to(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    panel.load_settings(AppSettings())
    panel.resize(420, 1200)
    panel.show()
    qtbot.waitExposed(panel)
    sampling = panel.sections["sampling"]
    assert sampling.summary.isVisible()

    assert sampling.summary.full_text() == sampling.summary_text() == "greedy · DRY 0.8 · up to 512 tokens"
    with qtbot.waitSignal(panel.settingsChanged):
        qtbot.mouseClick(sampling.header, Qt.MouseButton.LeftButton)
    assert sampling.is_expanded() and panel.top_k_spin.isVisible()
    assert sampling.summary.full_text() == "saved with the chat"  # what the open controls apply to

    sampling.header.setFocus()
    qtbot.keyClick(sampling.header, Qt.Key.Key_Space)
    assert not sampling.is_expanded() and not panel.top_k_spin.isVisible()
    assert sampling.header.focusPolicy() == Qt.FocusPolicy.StrongFocus


def test_the_sections_a_user_opened_are_open_again_after_a_restart(qtbot, make_window, fake_engine):
    settings = quick_settings()
    window = make_window(settings)
    panel = window.panel
    assert not any(section.is_expanded() for section in panel.sections.values())
    qtbot.mouseClick(panel.sections["model"].header, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.sections["system_prompt"].header, Qt.MouseButton.LeftButton)
    window.close()
    saved = AppSettings.load()
    assert saved.open_panel_sections == ["model", "system_prompt"]

    again = make_window(saved)
    opened = [name for name, section in again.panel.sections.items() if section.is_expanded()]
    assert opened == ["model", "system_prompt"]


@pytest.mark.parametrize("size", [(1366, 768), (1600, 1000)])
def test_with_its_sections_folded_the_panel_fits_a_laptop_screen_without_scrolling(qtbot, make_window, fake_engine,
                                                                                   size):
    window = make_window(quick_settings(auto=True))
    window.resize(*size)
    qtbot.waitExposed(window)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size, timeout=5000)
    qtbot.wait(1)
    bar = window.panel_scroll.verticalScrollBar()
    assert bar.maximum() == 0, f"the panel scrolls by {bar.maximum()} px at {size}"
    assert window.panel.live.isVisible()
