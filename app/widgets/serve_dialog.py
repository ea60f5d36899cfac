"""Model → Serve to other programs…: the local OpenAI-compatible server, switched on and off, and its address.

Another program (an editor's assistant, a script using the ``openai`` library) points its base URL at the address
shown here and gets the loaded model's replies, with plain decoding's text and lookahead's speed.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.server import ServerStats

from ..requests import LoadedModel
from ..serving import ServerController, new_api_key

HELP = ("Programs that speak OpenAI's or Anthropic's API can use the loaded model: give them the address below as "
        "the base URL (Anthropic's clients without the /v1 at its end), and the key when one is required. Chats "
        "here and their requests take turns; their requests do not appear among your chats.")


def served_text(model: LoadedModel | None) -> str:
    """What programs can ask of the server, with the loaded model."""
    tools = "tools" if model is not None and model.takes_tools else \
        "tools (not with this model: its chat template takes none)"
    return (f"Served: chat (/v1/chat/completions), completions (/v1/completions), JSON and grammars "
            f"(response_format), {tools}, and Anthropic's messages (/v1/messages).")


def stats_text(stats: ServerStats | None) -> str:
    if stats is None or not stats.served:
        return "No requests served yet."
    words = "request" if stats.served == 1 else "requests"
    return (f"{stats.served} {words} served. The last: {stats.last_tokens} tokens at {stats.last_tokens_per_s:.1f} "
            f"tokens/s, {stats.last_tokens_per_step:.2f} tokens per forward pass (lookahead {stats.last_lookahead}).")


class ServeDialog(QDialog):
    """The server's switch, settings, address and key, and what it has served."""

    def __init__(self, controller: ServerController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setWindowTitle("Serve to other programs")
        settings = controller.settings
        layout = QVBoxLayout(self)
        intro = QLabel(HELP)
        intro.setWordWrap(True)
        layout.addWidget(intro)

        self.serve_box = QCheckBox("Serve the loaded model")
        self.serve_box.setChecked(settings.serve_on)
        self.serve_box.toggled.connect(self._on_serve_toggled)
        layout.addWidget(self.serve_box)
        layout.addLayout(self._build_form())
        self._build_state_labels(layout)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        controller.stateChanged.connect(self.refresh)
        controller.statsChanged.connect(self.show_stats)
        self.setMinimumWidth(520)
        self.refresh()

    def _build_form(self) -> QFormLayout:
        """The port, who may connect, the key, and the address and key to copy."""
        settings = self.controller.settings
        form = QFormLayout()
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1024, 65535)
        self.port_spin.setValue(settings.serve_port)
        self.port_spin.setKeyboardTracking(False)  # a port is taken when typed whole
        self.port_spin.valueChanged.connect(self._on_port_changed)
        form.addRow("Port:", self.port_spin)
        self.network_box = QCheckBox("Let other computers on the network connect (they need the key)")
        self.network_box.setChecked(settings.serve_network)
        self.network_box.toggled.connect(self._on_network_toggled)
        form.addRow("", self.network_box)
        self.key_box = QCheckBox("Require an API key")
        self.key_box.setChecked(settings.serve_key_required or settings.serve_network)
        self.key_box.toggled.connect(self._on_key_toggled)
        form.addRow("", self.key_box)

        self.address_edit = QLineEdit()
        self.address_edit.setReadOnly(True)
        self.copy_address = QPushButton("Copy")
        self.copy_address.clicked.connect(lambda: self._copy(self.address_edit.text()))
        form.addRow("Base URL:", _row(self.address_edit, self.copy_address))

        self.key_edit = QLineEdit()
        self.key_edit.setReadOnly(True)
        self.copy_key = QPushButton("Copy")
        self.copy_key.clicked.connect(lambda: self._copy(self.key_edit.text()))
        self.new_key = QPushButton("New key")
        self.new_key.setToolTip("Make another key: programs using the old one are refused from now on")
        self.new_key.clicked.connect(self._on_new_key)
        form.addRow("API key:", _row(self.key_edit, self.copy_key, self.new_key))
        return form

    def _build_state_labels(self, layout: QVBoxLayout) -> None:
        """Whether it serves and what, and what it has served."""
        self.state_label = QLabel()
        self.state_label.setTextFormat(Qt.TextFormat.PlainText)  # a model's file name is shown as written
        self.state_label.setWordWrap(True)
        layout.addWidget(self.state_label)
        self.served_label = QLabel()
        self.served_label.setTextFormat(Qt.TextFormat.PlainText)
        self.served_label.setWordWrap(True)
        layout.addWidget(self.served_label)
        self.stats_label = QLabel(stats_text(None))
        self.stats_label.setWordWrap(True)
        layout.addWidget(self.stats_label)

    @Slot()
    def refresh(self) -> None:
        c, s = self.controller, self.controller.settings
        needs_key = c.needs_key
        _show_checked(self.key_box, needs_key)
        self.key_box.setEnabled(not s.serve_network)
        self.key_edit.setText(s.serve_key if needs_key else "")
        self.key_edit.setPlaceholderText("none: programs on this PC connect without one")
        for w in (self.key_edit, self.copy_key, self.new_key):
            w.setEnabled(needs_key)
        self.address_edit.setText(c.base_url)
        self.address_edit.setPlaceholderText("not serving")
        self.copy_address.setEnabled(c.running)
        if c.running and c.model is not None:
            where = "this PC and the network" if s.serve_network else "this PC only"
            self.state_label.setText(f"Serving {c.model.display_name} to programs on {where}.")
        elif c.error:
            self.state_label.setText(f"Not serving: {c.error}.")
        elif s.serve_on and c.model is None:
            self.state_label.setText("Serving starts once a model is loaded.")
        else:
            self.state_label.setText("Not serving.")
        self.served_label.setText(served_text(c.model))
        _show_checked(self.serve_box, s.serve_on)

    @Slot(object)
    def show_stats(self, stats: ServerStats) -> None:
        self.stats_label.setText(stats_text(stats))

    def _copy(self, text: str) -> None:
        if text:
            QGuiApplication.clipboard().setText(text)

    @Slot(bool)
    def _on_serve_toggled(self, on: bool) -> None:
        self.controller.set_serving(on)
        self.refresh()

    @Slot(int)
    def _on_port_changed(self, port: int) -> None:
        self._change(serve_port=port)

    @Slot(bool)
    def _on_network_toggled(self, on: bool) -> None:
        self._change(serve_network=on, serve_key_required=self.controller.settings.serve_key_required or on)

    @Slot(bool)
    def _on_key_toggled(self, on: bool) -> None:
        self._change(serve_key_required=on)

    @Slot()
    def _on_new_key(self) -> None:
        self._change(serve_key=new_api_key())

    def _change(self, **settings: object) -> None:
        """Take these server settings (remembered), serve again with them, show them."""
        for name, value in settings.items():
            setattr(self.controller.settings, name, value)
        self.controller.restart()
        self.refresh()


def _show_checked(box: QCheckBox, checked: bool) -> None:
    """Show ``checked`` without it counting as the user's click."""
    if box.isChecked() != checked:
        box.blockSignals(True)
        box.setChecked(checked)
        box.blockSignals(False)

def _row(*widgets: QWidget) -> QWidget:
    box = QWidget()
    row = QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        row.addWidget(w, 1 if isinstance(w, QLineEdit) else 0)
    return box
