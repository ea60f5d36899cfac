"""Checking a model file before llama.cpp sees it: that it is a whole, readable GGUF file whose metadata
llama.cpp will not crash on (header_checks.py), and the facts the app shows (``GgufSummary``).
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGMLQuantizationType, LlamaFileType

from engine.llama.gguf_header import (
    GGUF_MAGIC,
    HEADER_BYTES,
    SUPPORTED_VERSIONS,
    Corrupt,
    Header,
    TensorInfo,
    Truncated,
    UnsupportedVersion,
    first_int,
    parse_header,
)
from engine.llama.header_checks import MetadataDamaged, check_tensor_shapes, check_vocabulary
from engine.llama.problems import (
    DOWNLOAD_AGAIN,
    KIND_DAMAGED,
    KIND_EMPTY,
    KIND_MISSING,
    KIND_NOT_A_FILE,
    KIND_NOT_GGUF,
    KIND_TRUNCATED,
    KIND_UNREADABLE,
    KIND_VERSION,
    ModelFileError,
)
from engine.units import plain_size

# Recurrent states kept back per sequence on models with recurrent memory: the longest draft such a model
# verifies in one step. Each costs a copy of the recurrent state (a few rows per layer for LFM2's short
# convolutions, a state matrix per head and layer for Qwen3.5's delta net).
ROLLBACK_TOKENS = 12


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
    kv_bytes_per_token: int = 0  # f16 K+V cache of one token over all layers (0: unknown or no attention cache)
    state_bytes: int = 0  # F32 recurrent state of one sequence over the recurrent layers (0: none or unknown)
    n_params: int = 0  # elements of all tensors, as llama.cpp counts a model's parameters
    matrix_types: tuple[tuple[str, int], ...] = ()  # (ggml type, how many) of the weight matrices (2-D and up)

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """Estimated size of the engine's cache for ``n_ctx`` tokens: the KV cache (f16, the llama.cpp default),
        and a recurrent memory's state with the copies kept to take a draft back (loaded.open_context)."""
        return self.kv_bytes_per_token * n_ctx + self.state_bytes * (1 + ROLLBACK_TOKENS)


def _cut_short(size: int, need: int | None = None) -> str:
    """The plain sentence for a file that ends early (``need``: the bytes the model needs, when known)."""
    if need is not None:
        held = f"it holds {plain_size(size)} of the {plain_size(need)} the model needs"
    else:
        return (f"This file is cut short or damaged: it holds {plain_size(size)} and ends partway through the "
                f"model's description. {DOWNLOAD_AGAIN}")
    return f"This file is cut short: {held}. The download or copy probably stopped early. {DOWNLOAD_AGAIN}"


def _damaged(what: str = "parts of its description hold impossible values") -> str:
    return f"This model file is damaged: {what}. It cannot be loaded safely. {DOWNLOAD_AGAIN}"


def _version_message(exc: UnsupportedVersion) -> str:
    if exc.big_endian:
        return "This model file was made for a different kind of computer (big-endian) and cannot be read here."
    if exc.version < min(SUPPORTED_VERSIONS):
        return (f"This model file uses an old GGUF version ({exc.version}) that llama.cpp no longer reads. "
                "Get a newer copy of the model.")
    return (f"This model file uses a newer GGUF version ({exc.version}) than this app can read. "
            "A newer version of the app may open it.")


def _read_header(p: Path, size: int) -> Header:
    with open(p, "rb") as fh:
        magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"not a GGUF file (bad magic {magic!r}): {p}",
                "This file is not a GGUF model. The app opens language models saved as .gguf files "
                "(llama.cpp's format).",
                KIND_NOT_GGUF,
            )
        if size < HEADER_BYTES:
            raise ModelFileError(
                f"truncated GGUF file: it ends inside its header ({size} of {HEADER_BYTES} bytes): {p}",
                _cut_short(size), KIND_TRUNCATED,
            )
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                return parse_header(mm, size)
            except Truncated as exc:
                where = str(exc) or "it ends inside its header"
                raise ModelFileError(
                    f"truncated or corrupt GGUF file: {where} (file size {size} bytes): {p}",
                    _cut_short(size), KIND_TRUNCATED,
                ) from None
            except UnsupportedVersion as exc:
                raise ModelFileError(f"corrupt GGUF file: {exc}: {p}", _version_message(exc), KIND_VERSION) from None
            except Corrupt as exc:
                raise ModelFileError(f"corrupt GGUF file: {exc}: {p}", _damaged(), KIND_DAMAGED) from None


def _recurrent_layers(meta: dict[str, object], arch: str, n_layer: int) -> list[bool]:
    """Which layers keep a recurrent state instead of a KV cache, as llama.cpp's loaders tell them apart:
    no key/value heads (LFM2, Nemotron-H, Granite 4.0 H), all but every n-th (Qwen3.5, Qwen3-Next), or all of them
    in a model without attention heads (Mamba, RWKV)."""
    interval = first_int(meta.get(f"{arch}.full_attention_interval"))
    if interval:
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    heads_kv = meta.get(f"{arch}.attention.head_count_kv")
    if isinstance(heads_kv, list):
        return [i < len(heads_kv) and int(heads_kv[i]) == 0 for i in range(n_layer)]
    return [not meta.get(f"{arch}.attention.head_count")] * n_layer


def _kv_bytes_per_token(meta: dict[str, object], arch: str) -> int:
    """f16 K+V bytes per cached token from the architecture's hyperparameters (0 if unknown)."""
    n_layer = first_int(meta.get(f"{arch}.block_count"))
    n_embd = first_int(meta.get(f"{arch}.embedding_length"))
    heads = meta.get(f"{arch}.attention.head_count")
    heads_kv = meta.get(f"{arch}.attention.head_count_kv", heads)
    if not n_layer or not n_embd or heads is None:
        return 0

    def per_layer(v: object) -> list[int]:
        if isinstance(v, list):
            return [int(x) for x in v[:n_layer]] + [0] * max(0, n_layer - len(v))
        return [int(v)] * n_layer if isinstance(v, int) else [0] * n_layer

    h, h_kv = per_layer(heads), per_layer(heads_kv)
    n_head = max(h) if h else 0
    if n_head <= 0:
        return 0  # no attention layers (recurrent): the state does not grow with the context
    k_len = first_int(meta.get(f"{arch}.attention.key_length")) or n_embd // n_head
    v_len = first_int(meta.get(f"{arch}.attention.value_length")) or n_embd // n_head
    recurrent = _recurrent_layers(meta, arch, n_layer)
    return sum(n * (k_len + v_len) for n, r in zip(h_kv, recurrent, strict=True) if not r) * 2


def _state_bytes(meta: dict[str, object], arch: str) -> int:
    """F32 recurrent state of one sequence (llama.cpp's n_embd_r + n_embd_s per recurrent layer; 0 if none)."""
    n_layer = first_int(meta.get(f"{arch}.block_count")) or 0
    n_embd = first_int(meta.get(f"{arch}.embedding_length")) or 0
    l_cache = first_int(meta.get(f"{arch}.shortconv.l_cache"))
    d_inner = first_int(meta.get(f"{arch}.ssm.inner_size"))
    if l_cache:  # LFM2: the last l_cache - 1 inputs of its short convolution
        per_layer = (l_cache - 1) * n_embd
    elif d_inner:  # Mamba-style: the convolution's inputs, then a state of d_state per inner channel
        d_conv = first_int(meta.get(f"{arch}.ssm.conv_kernel")) or 0
        d_state = first_int(meta.get(f"{arch}.ssm.state_size")) or 0
        n_group = first_int(meta.get(f"{arch}.ssm.group_count")) or 0
        per_layer = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
    else:
        return 0
    return per_layer * sum(_recurrent_layers(meta, arch, n_layer)) * 4


def check_gguf(path: str | os.PathLike[str]) -> GgufSummary:
    """Validate a model file before handing it to llama.cpp.

    Parses the header, metadata and tensor table (without touching the weights)
    and checks that the file is long enough to hold every tensor, so a broken
    or truncated download is refused with a reason instead of crashing the loader.
    Then the vocabulary (duplicate texts, array lengths and types, special token
    ids) and the tensor shapes against the hyper-parameters: damage llama.cpp
    would abort on, read out of bounds with, or report less clearly.
    """
    p = Path(path)
    size = _readable_size(p)
    header = _read_whole_header(p, size)
    try:
        check_vocabulary(header)
        check_tensor_shapes(header)
    except MetadataDamaged as exc:
        raise ModelFileError(f"{exc}, so the file is damaged: {p}", _damaged(exc.plain), KIND_DAMAGED) from None
    return _summary(p, size, header)


_NO_PERMISSION = "This file cannot be opened: you do not have permission to read it."


def _readable_size(p: Path) -> int:
    """The size of ``p``, a readable, non-empty regular file (else the ModelFileError saying what it is)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelFileError(
            f"model file not found: {p}", "This model file is not there any more: it may have been moved or deleted.",
            KIND_MISSING,
        ) from None
    except OSError as exc:
        raise ModelFileError(
            f"cannot access model file ({exc.strerror}): {p}", f"This file cannot be opened ({exc.strerror}).",
            KIND_UNREADABLE,
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(
            f"model path is a directory, not a GGUF file: {p}", "This is a folder, not a model file.", KIND_NOT_A_FILE
        )
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(
            f"model path is not a regular file: {p}", "This is not an ordinary file, so it cannot be a model.",
            KIND_NOT_A_FILE,
        )
    if not os.access(p, os.R_OK):
        raise ModelFileError(f"model file is not readable (permission denied): {p}", _NO_PERMISSION, KIND_UNREADABLE)
    if st.st_size == 0:
        raise ModelFileError(f"model file is empty: {p}", "This file is empty: it holds no model.", KIND_EMPTY)
    return st.st_size


def _read_whole_header(p: Path, size: int) -> Header:
    """The file's header, which must name tensors that all lie within its ``size`` bytes."""
    try:
        header = _read_header(p, size)
    except PermissionError:
        raise ModelFileError(
            f"model file is not readable (permission denied): {p}", _NO_PERMISSION, KIND_UNREADABLE
        ) from None
    except OSError as exc:
        raise ModelFileError(
            f"cannot read model file ({exc.strerror or exc}): {p}",
            f"This file cannot be read ({exc.strerror or exc}). If it is on a removable or network drive, "
            "check that the drive is still connected.",
            KIND_UNREADABLE,
        ) from None
    if not header.tensors:
        raise ModelFileError(
            f"GGUF file holds no tensors: {p}", "This GGUF file holds no model weights, only a description.",
            KIND_DAMAGED,
        )
    end = header.data_start + max(t.offset + t.n_bytes for t in header.tensors)
    if header.data_start > size:
        raise ModelFileError(
            f"truncated GGUF file: it ends before its tensor data starts ({size} bytes): {p}",
            _cut_short(size, end), KIND_TRUNCATED,
        )
    if end > size:
        raise ModelFileError(
            f"truncated GGUF file: tensors need {end} bytes, file has {size}: {p}", _cut_short(size, end),
            KIND_TRUNCATED,
        )
    return header


def _summary(p: Path, size: int, header: Header) -> GgufSummary:
    meta = header.metadata
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) and arch else "unknown"
    ftype = first_int(meta.get("general.file_type"))
    try:
        ftype_name = LlamaFileType(ftype).name.removeprefix("MOSTLY_") if ftype is not None else "unknown"
    except ValueError:
        ftype_name = str(ftype)
    name = meta.get("general.name")
    return GgufSummary(
        path=str(p),
        size_bytes=size,
        architecture=arch,
        name=name if isinstance(name, str) and name else p.stem,
        file_type=ftype_name,
        context_length=first_int(meta.get(f"{arch}.context_length")),
        n_tensors=len(header.tensors),
        has_chat_template="tokenizer.chat_template" in meta,
        kv_bytes_per_token=_kv_bytes_per_token(meta, arch),
        state_bytes=_state_bytes(meta, arch),
        n_params=sum(math.prod(t.dims) for t in header.tensors),
        matrix_types=tuple(sorted(tensor_type_counts(header.tensors, matrices_only=True).items())),
    )


def tensor_type_counts(tensors: list[TensorInfo], matrices_only: bool = False) -> dict[str, int]:
    """How many of ``tensors`` have each ggml type (by name: "Q4_K", "F32"), most first; ``matrices_only``:
    only tensors of two or more dimensions longer than 1 (the weight matrices)."""
    counts: Counter[str] = Counter()
    for t in tensors:
        if matrices_only and sum(d > 1 for d in t.dims) < 2:
            continue
        try:
            counts[GGMLQuantizationType(t.ggml_type).name] += 1
        except ValueError:
            counts[f"type {t.ggml_type}"] += 1
    return dict(counts.most_common())


def read_tensor_type_counts(path: str | os.PathLike[str]) -> dict[str, int]:
    """``tensor_type_counts`` of every tensor of the GGUF file at ``path``."""
    p = Path(path)
    return tensor_type_counts(_read_header(p, p.stat().st_size).tensors)
