"""The local server as the window shows it: the status bar's "Serving" label, Model → Serve to other programs…
(one dialog, raised when open), and a note when another program's request holds up a chat reply.

The server itself (settings, start, stop, its requests in turn with the chat's) is ``ServerController``'s.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtWidgets import QLabel, QMainWindow

from .serving import ServerController
from .widgets.serve_dialog import ServeDialog


class ServingStatus(QObject):
    """Shows whether and where ``serving`` serves the model; ``settings_changed()`` is called when it starts or
    stops (the window saves its settings)."""

    def __init__(self, serving: ServerController, window: QMainWindow, settings_changed: Callable[[], None]) -> None:
        super().__init__(window)
        self.serving = serving
        self._window = window
        self._settings_changed = settings_changed
        self.serve_dialog: ServeDialog | None = None
        self.serving_label = QLabel()
        self.serving_label.setTextFormat(Qt.TextFormat.PlainText)
        self.serving_label.hide()
        serving.stateChanged.connect(self._on_serving_changed)

    @Slot()
    def show_serve_dialog(self) -> ServeDialog:
        """Model → Serve to other programs…: one dialog, raised when open."""
        if self.serve_dialog is not None and self.serve_dialog.isVisible():
            self.serve_dialog.raise_()
            self.serve_dialog.activateWindow()
            return self.serve_dialog
        if self.serve_dialog is None:
            self.serve_dialog = ServeDialog(self.serving, self._window)
        self.serve_dialog.show()
        return self.serve_dialog

    @Slot()
    def _on_serving_changed(self) -> None:
        """The status bar says where the model is served; the settings are saved."""
        serving = self.serving
        self.serving_label.setVisible(serving.running)
        if serving.running:
            self.serving_label.setText("Serving")
            self.serving_label.setToolTip(f"Other programs can use the loaded model at {serving.base_url} "
                                          "(Model → Serve to other programs…)")
        self._settings_changed()

    @Slot()
    def say_if_a_program_goes_first(self) -> None:
        """A reply asked for while another program's request runs starts after it: say so, or the wait looks like
        a hang."""
        if self.serving.busy:
            self._window.statusBar().showMessage(
                "Another program's request to the model is being answered; this reply starts when it is done", 15000)
