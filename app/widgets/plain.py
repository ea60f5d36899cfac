"""Text from a model, a file or a GGUF header, shown as the characters it holds.

Qt guesses whether a string handed to a label, a message box or a tooltip is HTML (``Qt.mightBeRichText``): a model
whose ``general.name`` is ``<b>x</b><img src=x.png>`` would be drawn bold and its image read from disk, and a path
with ``&`` in it loses a character as a menu entry. Every widget that shows such text takes it through this module,
so Qt never guesses:

* ``Label`` is a QLabel that is always plain text (the app's own labels use it too);
* ``tip`` turns any text into a tooltip that shows it as written (tooltips have no plain-text switch);
* ``escape`` is for the few rich labels the app writes itself (the About box, Compare's verdict);
* ``message_box`` / ``show_message`` / ``ask`` are message boxes whose text is plain;
* ``menu_text`` is a file or model name as a menu entry or button text.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtWidgets import QLabel, QMessageBox, QWidget

Icon = QMessageBox.Icon
Button = QMessageBox.StandardButton


class Label(QLabel):
    """A label whose text is never taken as markup: ``<b>`` shows as those three characters."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)


def escape(text: str, newline: str = "<br>") -> str:
    """``text`` as a piece of a rich text the app writes itself (its line breaks as ``newline``)."""
    return html.escape(text, quote=False).replace("\n", newline)


def tip(text: str) -> str:
    """A tooltip that shows ``text`` as written, whatever it holds.

    Text that Qt would not take as HTML is returned unchanged (and so stays plain, unwrapped); the rest is converted
    to rich text that draws exactly its characters, with its line breaks.
    """
    if not GuiQt.mightBeRichText(text):
        return text
    return GuiQt.convertFromPlainText(text, Qt.WhiteSpaceMode.WhiteSpacePre)


def menu_text(text: str) -> str:
    """A name as a menu entry or button text: ``&`` is shown, not taken as the mark of a shortcut key."""
    return text.replace("&", "&&")


def message_box(
    parent: QWidget | None, icon: Icon, title: str, text: str, buttons: QMessageBox.StandardButton = Button.Ok,
) -> QMessageBox:
    """A message box whose text is plain and wraps like a rich one (a long path or reason stays inside the box)."""
    box = QMessageBox(icon, title, text, buttons, parent)
    box.setTextFormat(Qt.TextFormat.PlainText)
    label = box.findChild(QLabel, "qt_msgbox_label")
    if label is not None:
        label.setWordWrap(True)
    return box


def ask(
    parent: QWidget | None, icon: Icon, title: str, text: str, buttons: QMessageBox.StandardButton = Button.Ok,
) -> QMessageBox.StandardButton:
    """``message_box`` shown modally; the button the user pressed."""
    box = message_box(parent, icon, title, text, buttons)
    return QMessageBox.StandardButton(box.exec())


def show_message(parent: QWidget | None, icon: Icon, title: str, text: str) -> None:
    """A plain-text notice with an OK button, shown modally (as ``QMessageBox.warning`` and its kin do)."""
    ask(parent, icon, title, text)


def export_failed(parent: QWidget | None, path: object, exc: OSError) -> None:
    """Tell the person that a file they chose to write could not be written, and why."""
    show_message(parent, Icon.Critical, "Export failed", f"Could not write {path}: {exc}")
