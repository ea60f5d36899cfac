"""Model → Chat template…: the model's facts and the chat template its conversations are rendered with."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from engine.library.names import DRAFTS_ONLY_NOTE, LookaheadKind
from engine.llama.problems import LoadProblem
from engine.units import format_params, plain_size

from ..requests import LoadedModel
from . import plain
from .plain import Label

OWN_TEMPLATE_NOTE = "The model's own chat template, from its file."
FALLBACK_NOTE = (
    "This model file has no chat template, so a generic ChatML format is used. "
    "Replies may be worse than with the format the model was trained on."
)


def template_note(model: LoadedModel) -> str:
    """Whose chat template the conversation is rendered with."""
    if not model.template_is_fallback:
        return OWN_TEMPLATE_NOTE
    if model.template_format:
        return (f"This model file has no chat template. Its vocabulary has {model.template_format}'s turn markers, "
                f"so this app's {model.template_format} chat format is used.")
    return FALLBACK_NOTE


def show_problem(
    parent: QWidget, title: str, problem: LoadProblem, icon: QMessageBox.Icon = QMessageBox.Icon.Critical,
) -> QMessageBox:
    """A message box that says ``problem`` in plain words, with its technical detail behind "Show Details…".

    Opened window-modal without blocking (the app keeps running its engine's answers meanwhile);
    it deletes itself when closed. Returned so that the caller (and tests) can read what it says.
    """
    box = plain.message_box(parent, icon, title, problem.message)
    if problem.detail and problem.detail != problem.message:
        box.setDetailedText(problem.detail)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box


def lookahead_text(model: LoadedModel) -> str:
    """What lookahead this model gets, and why when it is less than all of it."""
    if model.lookahead_block_reason:
        return f"no: {model.lookahead_block_reason}"
    if model.lookahead_kind == LookaheadKind.DRAFTS_ONLY:
        return DRAFTS_ONLY_NOTE
    return "yes: drafts and the lookahead window"


def format_tokens(n: int | None) -> str:
    return f"{n:,} tokens" if n else "unknown"


class ModelInfoDialog(QDialog):
    """Read-only: the model's architecture, size and context, and its chat template (or the fallback in use)."""

    def __init__(self, model: LoadedModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Chat template — {model.display_name}")
        self.resize(720, 560)

        self.name_label = Label(model.display_name)  # the name the status bar and the library show
        bold = QFont(self.name_label.font())
        bold.setBold(True)
        self.name_label.setFont(bold)

        # One label per fact, by name, so the tests read what the user reads.
        self.facts: dict[str, QLabel] = {}
        form = QFormLayout()
        for name, value in (
            ("Name in the file", model.gguf_name),
            ("Architecture", model.architecture),
            ("Parameters", format_params(model.n_params)),
            ("Quantisation", model.file_type),
            ("Trained context", format_tokens(model.n_ctx_train)),
            ("Context in use", format_tokens(model.n_ctx)),
            ("File size", plain_size(model.size_bytes) if model.size_bytes else "unknown"),
            ("File", model.path),
            ("Batch kernels", "\n".join(model.batch_kernels) or "unknown"),
            ("Lookahead", lookahead_text(model)),
        ):
            label = Label(value)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(name in ("File", "Batch kernels", "Lookahead"))
            form.addRow(f"{name}:", label)
            self.facts[name] = label

        self.template_note = Label(template_note(model))
        self.template_note.setWordWrap(True)
        if model.template_is_fallback:
            self.template_note.setFont(bold)  # the palette's own text colour: readable light or dark

        self.template_view = QPlainTextEdit(model.template_source)
        self.template_view.setReadOnly(True)
        self.template_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.template_view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)  # templates are often one long line

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(self.name_label)
        layout.addLayout(form)
        layout.addWidget(self.template_note)
        layout.addWidget(self.template_view, 1)
        layout.addWidget(buttons)
