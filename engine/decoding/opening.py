"""Opening a model file for use: check it, test-load it in a child process the first time, then open the engine.

The app's worker and the command line (its commands, ``serve``, the soak and screening tools) open models only
here, so a file that would make llama.cpp abort ends as one error in each of them, never as the death of the
process that holds the engine (engine/llama/probe.py says how the child is run and its verdict remembered).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.decoding.runtime import Engine, default_threads
from engine.llama.bundled import default_model_path
from engine.llama.probe import ProbeResult, ensure_loadable


@dataclass(frozen=True)
class OpenedModel:
    """An engine open on ``path``, and what checking the file did first (``probe.probed``, ``probe.seconds``)."""

    engine: Engine
    path: Path
    probe: ProbeResult


class ModelOpener:
    """Opens model files, each checked and test-loaded before the engine opens it.

    ``check_loadable`` checks a file and test-loads it in a child the first time (``ensure_loadable``),
    ``engine_factory`` opens it (``Engine``), ``default_model`` names the file opened when none is given (the
    bundled model). Tests pass fakes for them.
    """

    def __init__(
        self,
        engine_factory: Callable[..., Engine] = Engine,
        check_loadable: Callable[..., ProbeResult] = ensure_loadable,
        default_model: Callable[[], Path] = default_model_path,
    ) -> None:
        self._engine_factory = engine_factory
        self._check_loadable = check_loadable
        self._default_model = default_model

    def open(
        self,
        path: str | os.PathLike[str] | None,
        n_ctx: int,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
        cancel: threading.Event | None = None,
    ) -> OpenedModel:
        """Open ``path`` (None or "": the default model) with a context of ``n_ctx`` tokens.

        ``n_threads`` None or 0 lets the engine pick them for this PC (the test load runs with as many as it
        would start with). ``progress`` follows the engine's load (False from it aborts the load); setting
        ``cancel`` stops a test load under way (``ProbeCancelled``). The file's problems raise
        ``ModelFileError`` or ``SettingsError`` in one line.
        """
        model_path = Path(path) if path else self._default_model()
        probe = self._check_loadable(model_path, n_ctx=n_ctx, n_threads=n_threads or default_threads(), cancel=cancel)
        engine = self._engine_factory(model_path, n_ctx=n_ctx, n_threads=n_threads or None, progress=progress,
                                      summary=probe.summary)
        return OpenedModel(engine, model_path, probe)
