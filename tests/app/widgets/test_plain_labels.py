"""Text from a model file, its GGUF header or its path is shown as the characters it holds, wherever it appears.

A model whose ``general.name`` is ``<b>x</b><img src=local.png>``, in a file called ``<img src=x.png> & co.gguf``, is
loaded in a real window; the status bar, its tooltip, the model info dialog, the About box, the library and the
recent-models menu are then read back as a person would see them (a label's rich text rendered to what it draws,
a menu entry without its shortcut marks). Each must show the name and the file name exactly, and no place may take
them as markup.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import QAbstractItemModel, QModelIndex, Qt
from PySide6.QtGui import QAction, QTextDocument
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtWidgets import QAbstractItemView, QApplication, QLabel, QMessageBox, QWidget

from app.widgets import plain
from app.widgets.library import LibraryDialog
from app.widgets.model_info import ModelInfoDialog
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, OFFSCREEN_NOISE, quick_settings
from tests.helpers.tiny_models import write_tiny_llama

NAME = "<b>x</b><img src=local.png>"
FILE_NAME = "<img src=x.png> & co.gguf"

HOSTILE = [
    NAME,
    "<script>alert(1)</script> runs",
    "Hello <span style=\"color:red;font-size:40px\">BIG</span>",
    "&lt;b&gt; is an entity, &amp; too",
    "a<b and b>c",
    "std::vector<int> v;",
    "<!DOCTYPE html><html><body>page</body></html>",
    "<a href=\"file:///etc/passwd\">link</a>",
    "first line\n<b>second</b> line",
    "x & y && z &",
    "مرحبا <b>بالعالم</b> 🙂",
]


def shown_by_label(label: QLabel) -> str:
    """What ``label`` draws: its text as characters, or its rich text rendered."""
    text = label.text()
    fmt = label.textFormat()
    if fmt == Qt.TextFormat.PlainText or (fmt == Qt.TextFormat.AutoText and not GuiQt.mightBeRichText(text)):
        return text
    doc = QTextDocument()
    doc.setHtml(text)
    return doc.toPlainText()


def shown_by_tooltip(tip: str) -> str:
    """What a tooltip draws: Qt shows a tip as rich text whenever it might be."""
    if not GuiQt.mightBeRichText(tip):
        return tip
    doc = QTextDocument()
    doc.setHtml(tip)
    return doc.toPlainText().replace("\xa0", " ")


def shown_by_menu(text: str) -> str:
    """A menu entry's text as drawn: ``&&`` is an ampersand, a single ``&`` marks the shortcut key."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&")


@pytest.mark.parametrize("text", HOSTILE)
def test_the_helpers_show_every_text_as_written(qtbot, text):
    label = plain.Label(text)
    qtbot.addWidget(label)
    assert shown_by_label(label) == text
    assert shown_by_tooltip(plain.tip(text)) == text
    assert shown_by_menu(plain.menu_text(text)) == text
    doc = QTextDocument()
    doc.setHtml(f"<p>{plain.escape(text)}</p>")
    assert doc.toPlainText() == text

    box = plain.message_box(None, plain.Icon.Warning, "Title", text)
    qtbot.addWidget(box)
    shown = box.findChild(QLabel, "qt_msgbox_label")
    assert shown is not None and shown_by_label(shown) == text
    assert shown.wordWrap()  # a long path or reason stays inside the box


def _columns(model: QAbstractItemModel) -> int:
    try:
        return model.columnCount(QModelIndex())
    except TypeError:  # a list model: one column
        return 1


def _widgets() -> list[QWidget]:
    return [w for top in QApplication.topLevelWidgets() for w in (top, *top.findChildren(QWidget))]


def _places() -> list[tuple[str, str, str]]:
    """Every text on screen or in a tooltip, as (where, what it holds, what it shows)."""
    places: list[tuple[str, str, str]] = []
    for w in _widgets():
        where = f"{type(w).__name__} {w.objectName()}"
        if isinstance(w, QLabel):
            places.append((f"label of {where}", w.text(), shown_by_label(w)))
        if w.toolTip():
            places.append((f"tooltip of {where}", w.toolTip(), shown_by_tooltip(w.toolTip())))
        model = w.model() if isinstance(w, QAbstractItemView) else None
        if model is not None:
            for row in range(model.rowCount(QModelIndex())):
                for col in range(_columns(model)):
                    index = model.index(row, col)
                    text = str(model.data(index, Qt.ItemDataRole.DisplayRole) or "")  # an item view draws it as is
                    tip = str(model.data(index, Qt.ItemDataRole.ToolTipRole) or "")
                    places.append((f"cell of {where}", text, text))
                    places.append((f"cell tooltip of {where}", tip, shown_by_tooltip(tip)))
        for action in w.actions():
            assert isinstance(action, QAction)
            places.append((f"menu entry of {where}", action.text(), shown_by_menu(action.text())))
            places.append((f"menu tooltip of {where}", action.toolTip(), shown_by_tooltip(action.toolTip())))
    return places


@OFFSCREEN_NOISE
def test_a_model_named_with_markup_is_shown_as_its_characters_everywhere(make_window, qtbot, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    path = str(write_tiny_llama(folder / FILE_NAME, name=NAME))
    window = make_window(quick_settings())
    window.measure_status.skip()
    window.modelChanged.connect(lambda _model: window.measure_status.skip())
    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(path)
    assert window.model.display_name == NAME

    window.menus.template_action.trigger()
    info = window.findChild(ModelInfoDialog)
    assert info is not None
    about = window.help.show_about()
    library = LibraryDialog([str(folder)], loaded_path=path)
    qtbot.addWidget(library)
    library.show()
    with qtbot.waitSignal(library.scanned, timeout=30_000):
        pass
    window.recent_menu.aboutToShow.emit()

    places = _places()
    with_name = [(where, held, shown) for where, held, shown in places if "local.png" in held]
    with_file = [(where, held, shown) for where, held, shown in places if "co.gguf" in held]
    for where, held, shown in with_name:
        assert NAME in shown, f"{where}: holds {held!r}, shows {shown!r}"
    for where, held, shown in with_file:
        assert FILE_NAME in shown or FILE_NAME[:-5] in shown, f"{where}: holds {held!r}, shows {shown!r}"

    # Each place a person looks for the model's name, read as drawn.
    assert shown_by_label(window.model_label).startswith(f"{NAME} · F16 · ctx ")
    assert NAME in shown_by_tooltip(window.model_label.toolTip())
    assert shown_by_label(info.name_label) == NAME and info.windowTitle().endswith(NAME)
    about_label = about.findChild(QLabel, "qt_msgbox_label")
    assert about_label is not None and f"Model in use: {NAME}" in shown_by_label(about_label)
    row = library.row_of(path)
    assert row >= 0 and library.model_at(row).name == NAME
    assert any(where.startswith("cell of") and shown.startswith(NAME) for where, _held, shown in with_name)
    assert any("tooltip" in where and FILE_NAME in shown for where, _held, shown in with_file)
    recent = [shown_by_menu(a.text()) for a in window.recent_menu.actions()]
    assert FILE_NAME in recent
    about.close()
    info.close()
    library.close()


def test_a_problem_box_quoting_a_path_shows_it_as_written(qtbot):
    from app.widgets.model_info import show_problem
    from engine.llama.problems import LoadProblem

    parent = QWidget()
    qtbot.addWidget(parent)
    problem = LoadProblem(message=f"Could not open /models/{FILE_NAME}: <b>not a GGUF file</b>", detail="<i>x</i>")
    box = show_problem(parent, "This file cannot be loaded", problem, QMessageBox.Icon.Warning)
    label = box.findChild(QLabel, "qt_msgbox_label")
    assert label is not None and shown_by_label(label) == problem.message
    box.close()
