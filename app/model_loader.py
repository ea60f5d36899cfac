"""Loading models on the worker and showing which one is in use (status bar labels, progress, errors), and the
Model menu's dialogs that choose the model to load (Open model…, Recent models, Library…) or show its facts
(Chat template…)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import platformdirs
from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu, QMessageBox, QProgressBar

from engine import ModelFileError, default_model_path
from engine.llama.problems import LoadProblem
from engine.units import format_params

from .engine_thread import EngineThread
from .requests import LoadedModel
from .settings import AppSettings
from .widgets import model_info, plain
from .widgets.library import LibraryDialog
from .widgets.model_info import ModelInfoDialog, template_note
from .widgets.plain import Label
from .widgets.plain import tip as plain_tip


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
        chat_format = f" · {model.template_format or 'generic'} chat format" if model.template_is_fallback else ""
        # the file type, unless the name says it already ("SmolLM2-135M-Instruct.Q4_1")
        kind = "" if model.file_type.lower() in model.display_name.lower() else f" · {model.file_type}"
        self.model_label.setText(f"{model.display_name}{kind} · ctx {model.n_ctx}{chat_format}")
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
            tip += ["", template_note(model)]
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


class ModelDialogs(QObject):
    """Model → Open model…, Recent models and Library… choose a model to load; Model → Chat template… shows the
    facts of the one in use. The recent models menu and the library dialog (one at a time) are kept here.

    ``load_model(path)`` loads a chosen model (the window's, which waits for a reply or a load under way);
    ``busy()`` says the engine is working for a reply, a comparison or a speed report; ``save_settings()`` keeps
    the folders the user chose.
    """

    def __init__(
        self,
        models: ModelLoader,
        settings: AppSettings,
        window: QMainWindow,
        load_model: Callable[[str], None],
        busy: Callable[[], bool],
        save_settings: Callable[[], None],
    ) -> None:
        super().__init__(window)
        self._models = models
        self.settings = settings
        self._window = window
        self._load_model = load_model
        self._busy = busy
        self._save_settings = save_settings
        self.recent_menu = QMenu("&Recent models", window)
        self.recent_menu.aboutToShow.connect(self._on_recent_menu_about_to_show)
        self.library_dialog: LibraryDialog | None = None

    @Slot()
    def open_model(self) -> None:
        """Model → Open model… (Ctrl+O): a GGUF file from disk; its folder is where the next one starts."""
        start = self.model_dialog_folder()
        path, _ = QFileDialog.getOpenFileName(self._window, "Open model", start, "GGUF models (*.gguf);;All files (*)")
        if path:
            self.settings.last_model_folder = str(Path(path).parent)
            self._save_settings()
            self._load_model(path)

    def model_dialog_folder(self) -> str:
        """Where Open model… starts: the folder a model was last opened from, else Downloads, else home.

        Never the bundled model's folder: that is inside the app's own installation.
        """
        for folder in (self.settings.last_model_folder, _downloads_folder()):
            if folder and Path(folder).is_dir():
                return folder
        return str(Path.home())

    @Slot()
    def _on_recent_menu_about_to_show(self) -> None:
        self.recent_menu.clear()
        for path in self.settings.recent_models:
            name = plain.menu_text(Path(path).name)
            action = self.recent_menu.addAction(name, functools.partial(self._load_model, path))
            action.setToolTip(plain.tip(path))
        if not self.settings.recent_models:
            self.recent_menu.addAction("(none)").setEnabled(False)

    @Slot()
    def open_library(self) -> None:
        """Model → Library…: the models other apps keep on this machine (one dialog at a time)."""
        if self.library_dialog is not None:
            self.library_dialog.raise_()
            self.library_dialog.activateWindow()
            return
        model = self._models.model
        dialog = LibraryDialog(self.settings.library_folders, self._window, model.path if model else None)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.modelChosen.connect(self._on_library_model_chosen)
        dialog.foldersChanged.connect(self._on_library_folders_changed)
        dialog.finished.connect(self._on_library_closed)
        self.library_dialog = dialog
        dialog.open()

    @Slot(str)
    def _on_library_model_chosen(self, path: str) -> None:
        if self._busy() or self._models.is_loading():
            self._window.statusBar().showMessage(
                "Wait for the reply or the load under way before loading another model", 5000)
            return
        self._load_model(path)

    @Slot(object)
    def _on_library_folders_changed(self, folders: list[str]) -> None:
        self.settings.library_folders = list(folders)
        self._save_settings()

    @Slot()
    def _on_library_closed(self) -> None:
        self.library_dialog = None

    @Slot()
    def show_chat_template(self) -> None:
        """Model → Chat template…: the model's facts and its template, read-only (closed dialogs are freed)."""
        if self._models.model is None:
            return
        dialog = ModelInfoDialog(self._models.model, self._window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()


def load_options(
    path: str, model: LoadedModel | None, settings: AppSettings, n_ctx: int, threads: int
) -> tuple[int, int]:
    """The context size and thread count to load ``path`` with: ``n_ctx`` and ``threads`` (the panel's) for the model
    in use, what another model was loaded with last time (where remembered)."""
    model_file = _model_file(path)
    if model is None or model_file != model.path:  # another model: load it as it was last time
        remembered = settings.model_settings(model_file)
        ctx, thr = remembered.get("n_ctx"), remembered.get("threads")
        n_ctx = ctx if isinstance(ctx, int) else n_ctx
        threads = thr if isinstance(thr, int) else threads
    return n_ctx, threads


def _model_file(path: str) -> str:
    """The file ``path`` names, as the loaded model reports it ("" = the bundled model)."""
    if path:
        return str(Path(path))
    try:
        return str(default_model_path())
    except ModelFileError:
        return ""


def _downloads_folder() -> str:
    """The user's Downloads folder, or "" if the platform has none."""
    try:
        return platformdirs.user_downloads_dir()
    except (OSError, RuntimeError):
        return ""
