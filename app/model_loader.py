"""Loading models on the worker and showing which one is in use (status bar labels, progress, errors)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QMainWindow, QMessageBox, QProgressBar

from engine.llama.problems import LoadProblem
from engine.units import format_params

from .requests import LoadedModel
from .widgets import model_info
from .widgets.model_info import FALLBACK_NOTE
from .widgets.plain import Label
from .widgets.plain import tip as plain_tip
from .worker import EngineThread


class ModelLoader(QObject):
    """Asks the worker for a model and follows the load; the model in use stays until a new one has loaded.

    A model remembered from last time that fails to load falls back to the bundled one.

    A failed load opens a message box in plain words with the technical detail behind "Show Details…"
    (``error_box``, the last one opened).

    Signals:
        loaded(object, str): a ``LoadedModel`` is in use; the path it was asked for ("" = the bundled model).
        failed(str): a load failed, in plain words (the dialog has been opened; the model in use, if any, stays).
        loadingChanged(): a load started or ended.
    """

    loaded = Signal(object, str)
    failed = Signal(str)
    loadingChanged = Signal()

    def __init__(self, engine: EngineThread, window: QMainWindow) -> None:
        super().__init__(window)
        self._engine = engine
        self._window = window
        self.model: LoadedModel | None = None
        self.loading_path: str | None = None
        self.closed = False
        self.error_box: QMessageBox | None = None
        self.model_label = Label("No model")
        self.lookahead_label = Label()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        w = engine.worker
        w.modelLoading.connect(self._on_loading)
        w.modelChecking.connect(self._on_checking)
        w.modelLoaded.connect(self._on_loaded)
        w.modelFailed.connect(self._on_failed)

    def is_loading(self) -> bool:
        return self.loading_path is not None

    def _name(self) -> str:
        return Path(self.loading_path).name if self.loading_path else "the model that comes with the app"

    def load(self, path: str, n_ctx: int, n_threads: int) -> None:
        """Load ``path`` ("" = the bundled model) with this context size and thread count (0 = automatic)."""
        self.loading_path = path
        self._n_ctx, self._n_threads = n_ctx, n_threads
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self._window.statusBar().showMessage(f"Loading {self._name()}…")
        self.loadingChanged.emit()
        self._engine.loadRequested.emit(path, n_ctx, n_threads)

    @Slot()
    def _on_checking(self) -> None:
        self._window.statusBar().showMessage(
            f"Loading {self._name()}… first a quick check that the file is complete (only the first time it is opened)"
        )

    @Slot(float)
    def _on_loading(self, fraction: float) -> None:
        self.progress.setValue(int(fraction * 1000))

    @Slot(object)
    def _on_loaded(self, model: LoadedModel) -> None:
        requested = self.loading_path or ""
        self.loading_path = None
        self.progress.setVisible(False)
        self.model = model
        generic = " · generic chat format" if model.template_is_fallback else ""
        # the file type, unless the name says it already ("SmolLM2-135M-Instruct.Q4_1")
        kind = "" if model.file_type.lower() in model.display_name.lower() else f" · {model.file_type}"
        self.model_label.setText(f"{model.display_name}{kind} · ctx {model.n_ctx}{generic}")
        checked = f" (the first-time check took {model.probe_s:.2f} s)" if model.probe_s is not None else ""
        trained = f" (trained on {model.n_ctx_train:,})" if model.n_ctx_train else ""
        named = f" (named “{model.gguf_name}” in the file)" if model.gguf_name != model.display_name else ""
        tip = [
            f"{model.display_name}{named}: {model.architecture}, {format_params(model.n_params)} parameters, "
            f"{model.file_type}",
            f"context {model.n_ctx:,} tokens{trained}",
            model.path,
            f"{model.n_threads} threads, loaded in {model.load_s:.2f} s{checked}",
        ]
        if model.template_is_fallback:
            tip += ["", FALLBACK_NOTE]
        tip += ["", "Model → Chat template… shows the template in use."]
        self.model_label.setToolTip(plain_tip("\n".join(tip)))
        blocked = model.lookahead_block_reason
        self.lookahead_label.setText("lookahead unavailable" if blocked else "lookahead available")
        self.lookahead_label.setToolTip(plain_tip(blocked or ""))
        # Short: the model's name is on the right of the status bar, the first-time check in its tooltip, and the
        # measurement that may start now takes room beside this message.
        self._window.statusBar().showMessage(f"Model loaded in {model.load_s:.2f} s", 5000)
        self.loadingChanged.emit()
        self.loaded.emit(model, requested)

    @Slot(str)
    def _on_failed(self, text: str) -> None:
        problem = LoadProblem.from_text(text)
        name = self._name()
        requested = self.loading_path
        self.loading_path = None
        self.progress.setVisible(False)
        self._window.statusBar().clearMessage()
        self.loadingChanged.emit()
        if self.closed:
            return
        if self.model is None and requested:
            # The model remembered from last time is gone: fall back to the bundled one.
            instead = "The model that comes with the app is loaded instead."
            fallback = replace(problem, message=f"{problem.message}\n\n{instead}")
            self.error_box = model_info.show_problem(
                self._window, f"Could not open {name}", fallback, QMessageBox.Icon.Warning)
            self.failed.emit(problem.message)
            self.load("", self._n_ctx, self._n_threads)
            return
        self.error_box = model_info.show_problem(self._window, f"Could not open {name}", problem)
        if self.model is None:
            self.model_label.setText("No model — use Model → Open model…")
        self.failed.emit(problem.message)
