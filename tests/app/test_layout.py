"""The window on laptop screens: the chat keeps priority, side panels give way and come back, nothing is cut."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest
from PySide6.QtWidgets import QWidget

from app.main_window import MainWindow
from app.settings import AppSettings
from app.widgets.side_panels import NARROW_WINDOW_WIDTH
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine

pytestmark = [OFFSCREEN_NOISE]

LAPTOP_SIZES = [(1024, 700), (1366, 768)]


@pytest.fixture
def fake_engine(worker_options: dict) -> None:
    use_fake_engine(worker_options, lambda engine: SimpleNamespace())


def resized(qtbot, window: MainWindow, width: int, height: int) -> MainWindow:
    window.resize(width, height)
    qtbot.waitExposed(window)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (width, height), timeout=5000)
    qtbot.waitUntil(lambda: window.is_narrow() == (width < NARROW_WINDOW_WIDTH), timeout=5000)
    qtbot.wait(1)  # the splitter's new sizes are painted from the same pass of the event loop
    return window


def wholly_inside(window: MainWindow, widget: QWidget) -> bool:
    """``widget`` is shown and its whole rectangle lies inside the window's."""
    top_left = widget.mapTo(window, widget.rect().topLeft())
    bottom_right = widget.mapTo(window, widget.rect().bottomRight())
    return widget.isVisible() and window.rect().contains(top_left) and window.rect().contains(bottom_right)


@pytest.mark.parametrize(("width", "height"), LAPTOP_SIZES, ids=["1024x700", "1366x768"])
def test_on_a_laptop_screen_the_chat_is_wider_than_each_side_panel_and_nothing_essential_is_cut(
    qtbot, make_window, fake_engine, width, height
):
    window = resized(qtbot, make_window(quick_settings()), width, height)
    meter = window.chat_pane.context_meter
    meter.set_context(131_072)
    meter.set_usage(123_456, 7_890)  # the longest line the meter writes
    qtbot.waitUntil(lambda: meter.label.width() > 0)

    chat = window.tabs.width()
    sides = [w for w in (window.conversations, window.panel_scroll) if w.isVisible()]
    assert window.panel_scroll in sides  # the live stats stay in view
    for side in sides:
        assert chat > side.width(), (chat, side.width())
    # The panel is shown whole across (its scroll area has no horizontal scroll bar).
    assert window.panel.width() >= window.panel.minimumSizeHint().width()
    for widget in (window.send_button, window.input, meter.label, window.chat_view):
        assert wholly_inside(window, widget), widget
    assert window.input.height() >= window.input.minimumHeight()
    label = meter.label
    assert label.full_text() == "123,456 / 131,072 tokens · system 7,890"
    assert label.text() == label.full_text() or (label.text().endswith("…") and label.toolTip() == label.full_text())
    # Whatever was put away can be brought back from a button in view.
    for button, side in ((window.side_panels.chat_list_button, window.conversations),
                         (window.side_panels.panel_button, window.panel_scroll)):
        assert wholly_inside(window, button) and button.defaultAction().isChecked() == side.isVisible()


def test_a_narrow_window_puts_the_chats_list_away_and_a_wide_one_brings_it_back_as_it_was(
    qtbot, make_window, fake_engine
):
    window = resized(qtbot, make_window(quick_settings()), 1400, 860)
    wide_sizes = window.splitter.sizes()
    assert window.conversations.isVisible() and not window.is_narrow()

    resized(qtbot, window, 1024, 700)
    assert window.is_narrow() and not window.conversations.isVisible()
    assert not window.side_panels.chat_list_action.isChecked()
    assert window.panel_scroll.width() < wide_sizes[2]  # the panel narrowed for the chat
    assert window.settings.show_chat_list  # put away for now, not the user's choice

    resized(qtbot, window, 1400, 860)
    qtbot.waitUntil(lambda: window.splitter.sizes() == wide_sizes, timeout=5000)
    assert window.conversations.isVisible() and window.side_panels.chat_list_action.isChecked()


def test_the_users_own_choice_of_panels_is_not_undone_by_resizing(qtbot, make_window, fake_engine):
    window = resized(qtbot, make_window(quick_settings()), 1024, 700)
    window.side_panels.chat_list_button.click()  # the user wants the list even in a narrow window
    assert window.conversations.isVisible()
    resized(qtbot, window, 1400, 860)
    resized(qtbot, window, 1024, 700)
    assert window.conversations.isVisible()

    resized(qtbot, window, 1400, 860)
    window.side_panels.chat_list_action.trigger()  # and now hides it in a wide one
    window.side_panels.panel_action.trigger()
    resized(qtbot, window, 1024, 700)
    resized(qtbot, window, 1400, 860)
    assert not window.conversations.isVisible() and not window.panel_scroll.isVisible()
    assert window.tabs.width() > 1300  # the chat has the room
    saved = AppSettings.load()
    assert (saved.show_chat_list, saved.show_decoding_panel) == (False, False)


def test_a_splitter_the_user_arranged_is_saved_as_they_left_it_even_when_closed_narrow(
    qtbot, make_window, fake_engine
):
    window = resized(qtbot, make_window(quick_settings()), 1400, 860)
    sizes = window.splitter.sizes()
    window.splitter.setSizes([sizes[0], sizes[1] - 100, sizes[2] + 100])
    qtbot.waitUntil(lambda: window.panel_scroll.width() == sizes[2] + 100, timeout=5000)
    arranged = bytes(window.splitter.saveState().data())
    resized(qtbot, window, 1024, 700)
    assert window.panel_scroll.width() < sizes[2]
    window.close()

    assert base64.b64decode(AppSettings.load().splitter_state) == arranged


def test_the_narrow_layout_starts_below_its_threshold_only(qtbot, make_window, fake_engine):
    window = resized(qtbot, make_window(quick_settings()), NARROW_WINDOW_WIDTH, 800)
    assert not window.is_narrow() and window.conversations.isVisible()
    resized(qtbot, window, NARROW_WINDOW_WIDTH - 1, 800)
    assert window.is_narrow() and not window.conversations.isVisible()


def test_a_context_line_without_room_is_shortened_with_the_whole_line_as_its_tooltip(qtbot):
    from app.widgets.context_meter import ContextMeter

    meter = ContextMeter()
    qtbot.addWidget(meter)
    meter.set_context(131_072)
    meter.set_usage(123_456, 7_890)
    meter.resize(900, 30)
    meter.show()
    qtbot.waitExposed(meter)
    label = meter.label
    qtbot.waitUntil(lambda: label.text() == label.full_text())
    assert label.toolTip() == ""

    meter.resize(190, 30)
    qtbot.waitUntil(label.is_elided)
    assert label.text().endswith("…") and len(label.text()) > 1
    assert label.toolTip() == "123,456 / 131,072 tokens · system 7,890"
    assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width()


def test_a_long_chat_title_ends_in_an_ellipsis_instead_of_scrolling_the_chats_list_sideways(qtbot):
    from app.store import Conversation
    from app.widgets.conversation_list import ConversationList

    title = "How do I reverse the words of a sentence in Python while keeping the punctuation in place? " * 3
    chats = ConversationList()
    qtbot.addWidget(chats)
    chats.set_conversations([Conversation(1, title, "", 0.0, 0.0), Conversation(2, "Short", "", 0.0, 0.0)], 1)
    chats.resize(240, 300)
    chats.show()
    qtbot.waitExposed(chats)

    view = chats.list
    assert not view.horizontalScrollBar().isVisible()
    assert view.horizontalScrollBar().maximum() == 0
    assert view.visualItemRect(view.item(0)).right() <= view.viewport().width()
    assert view.item(0).toolTip() == title


@pytest.mark.parametrize(("first_message", "title"), [
    ("List the planets of the solar system, one per line, with one fact each.",
     "List the planets of the solar system…"),
    ("Short question?\nwith a second line", "Short question?"),
    ("https://example.com/a/very/long/address/that/has/no/spaces/in/it", "https://example.com/a/very/long/address/…"),
    ("   ", "New chat"),
    ("Exactly forty characters in this title!!", "Exactly forty characters in this title!!"),
])
def test_a_new_chats_title_is_its_first_line_cut_at_a_word(first_message, title):
    from app.chat_controller import TITLE_LENGTH, chat_title

    assert chat_title(first_message) == title
    assert len(chat_title(first_message)) <= TITLE_LENGTH + 1
