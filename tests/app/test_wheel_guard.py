"""The mouse wheel scrolls the panel; it changes a field's value only when the field has keyboard focus."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QScrollArea,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.wheel_guard import WheelGuard, install_wheel_guard
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine

pytestmark = [OFFSCREEN_NOISE]

WHEEL_DOWN = QPoint(0, -120)  # one notch towards the user: the page scrolls down, a spin box steps down


@pytest.fixture
def fake_engine(worker_options: dict) -> None:
    use_fake_engine(worker_options, lambda engine: SimpleNamespace())


def wheel_over(widget: QWidget, delta: QPoint = WHEEL_DOWN) -> None:
    """One notch of a real (spontaneous) wheel with the pointer over the middle of ``widget``."""
    top = widget.window()
    QTest.wheelEvent(top.windowHandle(), QPointF(widget.mapTo(top, widget.rect().center())), delta)


@pytest.fixture
def small_window(qtbot, make_window, fake_engine):
    """The main window at a laptop size, its decoding panel scrolled so Top-k is in view with more below."""
    window = make_window(quick_settings(open_panel_sections=["sampling", "model", "system_prompt"]))
    window.resize(1024, 600)
    qtbot.waitExposed(window)
    qtbot.waitActive(window)
    qtbot.waitUntil(lambda: window.panel_scroll.verticalScrollBar().maximum() > 0)
    window.panel_scroll.ensureWidgetVisible(window.panel.top_k_spin)
    window.input.setFocus()
    qtbot.waitUntil(window.input.hasFocus)
    return window


def test_the_wheel_over_an_unfocused_spin_box_scrolls_the_decoding_panel_and_keeps_the_value(qtbot, small_window):
    window = small_window
    spin, bar = window.panel.top_k_spin, window.panel_scroll.verticalScrollBar()
    spin.setValue(40)
    start = bar.value()
    assert start < bar.maximum()  # there is room to scroll down

    wheel_over(spin)

    qtbot.waitUntil(lambda: bar.value() > start)
    assert spin.value() == 40
    assert not spin.hasFocus() and window.input.hasFocus()  # the wheel did not take focus either


def test_with_keyboard_focus_the_wheel_changes_the_spin_box_and_the_panel_stays(qtbot, small_window):
    window = small_window
    spin, bar = window.panel.top_k_spin, window.panel_scroll.verticalScrollBar()
    spin.setValue(40)
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus)
    start = bar.value()

    wheel_over(spin)

    qtbot.waitUntil(lambda: spin.value() == 39)
    assert bar.value() == start


def test_the_panels_fields_are_not_focused_by_the_wheel(small_window):
    panel = small_window.panel
    fields = panel.findChildren(QSpinBox) + panel.findChildren(QDoubleSpinBox)
    assert panel.top_k_spin in fields
    assert {field.focusPolicy() for field in fields} == {Qt.FocusPolicy.StrongFocus}


@pytest.mark.parametrize("kind", [QSpinBox, QDoubleSpinBox, QComboBox, QSlider])
def test_every_kind_of_field_in_any_scroll_area_lets_the_wheel_scroll_unless_focused(qtbot, kind):
    install_wheel_guard()
    area = QScrollArea()
    qtbot.addWidget(area)
    content = QWidget()
    layout = QVBoxLayout(content)
    elsewhere = QLineEdit()  # where the keyboard focus is
    layout.addWidget(elsewhere)
    layout.addSpacing(400)
    field = kind()
    if isinstance(field, QComboBox):
        field.addItems(["one", "two", "three"])
        field.setCurrentIndex(1)
    elif isinstance(field, QSlider):
        field.setOrientation(Qt.Orientation.Horizontal)
        field.setRange(0, 10)
        field.setValue(5)
    else:
        field.setRange(0, 10)
        field.setValue(5)
    layout.addWidget(field)
    layout.addSpacing(1200)
    area.setWidget(content)
    area.resize(300, 500)
    area.show()
    qtbot.waitExposed(area)
    qtbot.waitActive(area)
    elsewhere.setFocus()
    qtbot.waitUntil(elsewhere.hasFocus)
    value = field.currentIndex if isinstance(field, QComboBox) else field.value
    before, bar = value(), area.verticalScrollBar()
    assert field.focusPolicy() == Qt.FocusPolicy.StrongFocus

    wheel_over(field)
    qtbot.waitUntil(lambda: bar.value() > 0)
    assert value() == before and not field.hasFocus()

    field.setFocus()
    qtbot.waitUntil(field.hasFocus)
    scrolled = bar.value()
    wheel_over(field)
    qtbot.waitUntil(lambda: value() != before)
    assert bar.value() == scrolled


def test_the_guard_is_installed_once_however_many_windows_ask(qapp):
    first, second = install_wheel_guard(), install_wheel_guard()
    assert first is second
    assert qapp.findChildren(WheelGuard) == [first]
