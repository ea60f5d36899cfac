"""The Help menu (keyboard shortcuts read from the actions, About) and the Model menu's Open model…."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from types import SimpleNamespace

import platformdirs
import pytest
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMenu

from app.settings import AppSettings
from app.widgets.shortcuts import WIDGET_KEYS, action_label, shortcut_text
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine

pytestmark = [OFFSCREEN_NOISE]


@pytest.fixture
def fake_engine(worker_options: dict) -> None:
    use_fake_engine(worker_options, lambda engine: SimpleNamespace())


def menu_titled(window, title: str) -> QMenu:
    for action in window.menuBar().actions():
        if action.text().replace("&", "") == title and isinstance(action.menu(), QMenu):
            return action.menu()
    raise AssertionError(f"no {title} menu")


def shown_rows(dialog) -> set[tuple[str, str]]:
    table = dialog.table
    return {(table.item(i, 0).text(), table.item(i, 1).text()) for i in range(table.rowCount())}


def test_keyboard_shortcuts_lists_every_action_that_has_a_shortcut(qtbot, make_window, fake_engine):
    window = make_window(quick_settings())
    with_keys = [a for a in window.findChildren(QAction) if a.shortcuts()]
    assert len(with_keys) >= 12  # File, Model, Chat, Compare, View and Help all have some

    dialog = window.help.show_shortcuts()
    qtbot.waitExposed(dialog)
    rows = shown_rows(dialog)

    for action in with_keys:
        assert (action_label(action), shortcut_text(action)) in rows, action.text()
    assert set(WIDGET_KEYS) <= rows  # Enter, Shift+Enter, Esc, Tab… that no action carries
    assert ("Open model", QKeySequence(QKeySequence.StandardKey.Open).toString(
        QKeySequence.SequenceFormat.NativeText)) in rows
    dialog.close()


def test_a_shortcut_added_later_is_in_the_list_without_anyone_editing_it(qtbot, make_window, fake_engine):
    window = make_window(quick_settings())
    extra = menu_titled(window, "Chat").addAction("Summarise chat")
    extra.setShortcut(QKeySequence("Ctrl+Alt+S"))

    dialog = window.help.show_shortcuts()
    assert ("Summarise chat", shortcut_text(extra)) in shown_rows(dialog)
    dialog.close()


def test_the_help_menu_has_the_shortcuts_and_about_which_names_the_app_and_its_version(qtbot, make_window,
                                                                                       fake_engine):
    window = make_window(quick_settings())
    assert menu_titled(window, "Help").actions() == [window.menus.shortcuts_action, window.menus.log_folder_action,
                                                     window.menus.about_action]
    box = window.help.show_about()
    qtbot.waitExposed(box)
    version = importlib.metadata.version("lookahead-chat")  # the installed project's, as the box reads it
    assert f"Lookahead Chat {version}" in box.text() and "Fake" in box.text()
    box.close()


def test_open_model_is_in_the_model_menu_as_the_one_action_file_also_shows(make_window, fake_engine):
    window = make_window(quick_settings())
    model_menu, file_menu = menu_titled(window, "Model"), menu_titled(window, "File")
    assert model_menu.actions()[0] is window.menus.open_action
    assert window.menus.open_action in file_menu.actions()
    assert window.menus.open_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Open)
    assert len([a for a in window.findChildren(QAction) if a.text() == "&Open model…"]) == 1


@pytest.fixture
def downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "Downloads"
    folder.mkdir()
    monkeypatch.setattr(platformdirs, "user_downloads_dir", lambda: str(folder))
    return folder


@pytest.fixture
def file_dialog(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Open-file dialogs answer ``choice`` at once and record the folder they started in."""
    log = SimpleNamespace(starts=[], choice="")

    def answer(_parent, _caption, start, _filter):
        log.starts.append(start)
        return log.choice, ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(answer))
    return log


def test_open_model_starts_in_downloads_then_in_the_folder_the_last_model_came_from(
    qtbot, make_window, fake_engine, downloads, file_dialog, tmp_path
):
    window = make_window(quick_settings())
    models = tmp_path / "my models"
    models.mkdir()
    file_dialog.choice = str(models / "other.gguf")
    (models / "other.gguf").write_bytes(b"GGUF")

    with qtbot.waitSignal(window.modelChanged, timeout=10_000):
        window.menus.open_action.trigger()
    assert file_dialog.starts == [str(downloads)]  # not the bundled model's folder (/models here)
    assert window.model.path.endswith("other.gguf")

    file_dialog.choice = ""  # cancelled: nothing changes
    window.menus.open_action.trigger()
    assert file_dialog.starts[-1] == str(models)
    assert AppSettings.load().last_model_folder == str(models)  # remembered across runs


def test_open_model_falls_back_to_home_without_downloads_and_forgets_a_folder_that_is_gone(
    make_window, fake_engine, file_dialog, tmp_path, monkeypatch
):
    monkeypatch.setattr(platformdirs, "user_downloads_dir", lambda: str(tmp_path / "no such folder"))
    monkeypatch.setenv("HOME", str(tmp_path))
    window = make_window(quick_settings(last_model_folder=str(tmp_path / "deleted")))

    window.menus.open_action.trigger()
    assert file_dialog.starts == [str(tmp_path)]
