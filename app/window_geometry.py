"""The window's size and place, and its splitter, kept between runs.

They are stored in the settings as base64 text (``AppSettings.geometry`` and
``splitter_state``); a damaged value keeps the default layout. The window, as
restored or at its first size, is fitted to the screen's free area.
"""

from __future__ import annotations

import base64

from PySide6.QtCore import QByteArray, QMargins, QRect, QSize
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMainWindow, QSplitter

from .settings import AppSettings

DEFAULT_SIZE = QSize(1360, 860)  # the first window's size on a screen with room for it
# What the window system adds around the window (title bar, borders): it says how much only once the window is shown.
FRAME_ALLOWANCE = QMargins(8, 32, 8, 8)


def save_geometry(window: QMainWindow, splitter_state: QByteArray, settings: AppSettings) -> None:
    """Keep the window's geometry and ``splitter_state`` in ``settings`` (saved with them)."""
    settings.geometry = _encode(window.saveGeometry())
    settings.splitter_state = _encode(splitter_state)


def restore_geometry(window: QMainWindow, splitter: QSplitter, settings: AppSettings) -> None:
    """Put the window and ``splitter`` back as ``settings`` keep them, then fit the window to its screen."""
    restored = False
    try:
        if settings.geometry:
            restored = window.restoreGeometry(QByteArray(base64.b64decode(settings.geometry)))
        if settings.splitter_state:
            splitter.restoreState(QByteArray(base64.b64decode(settings.splitter_state)))
    except ValueError:
        pass  # a damaged value: keep the default layout
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is None or window.isMaximized() or window.isFullScreen():
        return
    fitted = fit_to_screen(window.geometry(), screen.availableGeometry(), window.minimumSizeHint(), centre=not restored)
    if fitted != window.geometry():
        window.setGeometry(fitted)


def fit_to_screen(window: QRect, available: QRect, minimum: QSize, centre: bool) -> QRect:
    """``window`` (its inside, as ``geometry()``) made to fit the screen's free area with its frame around it: no
    bigger (but not below ``minimum``) and moved inside; ``centre`` places it in the middle, as for a first window,
    else it moves only as far as it must."""
    frame = FRAME_ALLOWANCE
    room = available.marginsRemoved(frame)
    fitted = QRect(window.topLeft(), QSize(
        max(minimum.width(), min(window.width(), room.width())),
        max(minimum.height(), min(window.height(), room.height())),
    ))
    if centre:
        fitted.moveCenter(room.center())
    fitted.moveLeft(max(room.left(), min(fitted.left(), room.right() + 1 - fitted.width())))
    fitted.moveTop(max(room.top(), min(fitted.top(), room.bottom() + 1 - fitted.height())))
    return fitted


def _encode(state: QByteArray) -> str:
    return base64.b64encode(bytes(state.data())).decode("ascii")
