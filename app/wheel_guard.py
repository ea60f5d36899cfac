"""The mouse wheel scrolls; it changes a setting only in the field the user has clicked into.

Qt's spin boxes, combo boxes and sliders take the wheel whenever the pointer is
over them, so scrolling a panel of settings quietly changes whichever one passes
under the pointer (and the value is then saved with the chat). ``WheelGuard`` is
one application-wide event filter: a wheel over such a field without keyboard
focus goes to the scroll area around it instead, and the field keeps its value.
The fields also lose Qt's "wheel gives focus" policy, so a wheel never focuses them.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QScrollBar,
    QWidget,
)

__all__ = ["WheelGuard", "install_wheel_guard", "is_guarded"]


def is_guarded(widget: QObject) -> bool:
    """Whether ``widget`` is a field whose value the wheel would change (spin box, combo box, slider, dial)."""
    if isinstance(widget, QScrollBar):  # scrolling is exactly what a scroll bar's wheel is for
        return False
    return isinstance(widget, (QAbstractSpinBox, QComboBox, QAbstractSlider))


def _scroll_area_around(widget: QWidget) -> QAbstractScrollArea | None:
    """The nearest scroll area ``widget`` sits inside (not one it merely owns, like a combo box's popup)."""
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea):
            return parent
        parent = parent.parentWidget()
    return None


def _has_focus(widget: QWidget) -> bool:
    """The field or a part of it (a spin box's line edit, an editable combo box's) has keyboard focus."""
    focus = QApplication.focusWidget()
    return focus is not None and (focus is widget or widget.isAncestorOf(focus))


class WheelGuard(QObject):
    """Sends the wheel over an unfocused field to the scroll area around it; install once on the application."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt name)
        kind = event.type()
        if kind == QEvent.Type.Polish and is_guarded(watched):
            assert isinstance(watched, QWidget)
            _no_wheel_focus(watched)
        elif kind == QEvent.Type.Wheel and is_guarded(watched):
            assert isinstance(watched, QWidget) and isinstance(event, QWheelEvent)
            _no_wheel_focus(watched)  # a field made before the guard was installed
            if not _has_focus(watched):
                self._scroll_instead(watched, event)
                return True
        return False

    @staticmethod
    def _scroll_instead(field: QWidget, event: QWheelEvent) -> None:
        """Give the wheel to the enclosing scroll area's viewport, at the same place on screen."""
        area = _scroll_area_around(field)
        if area is None:
            # No scroll area here: a real (spontaneous) wheel still travels on to the field's parents.
            event.ignore()
            return
        viewport = area.viewport()
        position = viewport.mapFromGlobal(event.globalPosition())
        forwarded = QWheelEvent(
            position, event.globalPosition(), event.pixelDelta(), event.angleDelta(), event.buttons(),
            event.modifiers(), event.phase(), event.inverted(), source=event.source(), device=event.pointingDevice(),
        )
        QCoreApplication.sendEvent(viewport, forwarded)
        event.accept()


def _no_wheel_focus(widget: QWidget) -> None:
    """Tab and click still focus the field; the wheel no longer does."""
    if widget.focusPolicy() == Qt.FocusPolicy.WheelFocus:
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)


def install_wheel_guard(app: QCoreApplication | None = None) -> WheelGuard:
    """Install the guard on ``app`` (the running application by default) once; returns it.

    Fields that exist already are fixed at once; later ones when Qt polishes them.
    """
    app = app if app is not None else QCoreApplication.instance()
    if app is None:
        raise RuntimeError("install_wheel_guard needs a QApplication")
    existing = app.findChild(WheelGuard)
    if isinstance(existing, WheelGuard):
        return existing
    guard = WheelGuard(app)
    app.installEventFilter(guard)
    if isinstance(app, QApplication):
        for widget in app.allWidgets():
            if is_guarded(widget):
                _no_wheel_focus(widget)
    return guard
