"""Models in the exact shape of real ones, with random weights: what a real file of that shape costs to run.

A benchmark of a 1B model measures the 1B model's matrices, not its words: a file with the same tensors, of
the same types, runs at the same speed. ``build_shape`` writes one: the named shape's hyper-parameters and
tensors (names from gguf-py's tables), seeded random F16 weights, a byte-level vocabulary of exactly the real
size, then llama.cpp's own quantizer picks each tensor's type for the asked file type, as it does for the
published files (Q4_K_M: Q6_K for the embeddings and some of attn_v/ffn_down, Q4_K elsewhere). Its text is
noise; its speed is the real model's.

Written with gguf's GGUFWriter (llama.cpp's gguf-py), tensor by tensor: memory holds the largest tensor in F32
and F16 at most (llama-1b peaks under 2 GB, quantizing included).

    python -m engine shape llama-1b llama-1b-q4_k_m.gguf --type q4_k_m
"""

from __future__ import annotations

import itertools
import os
import string
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .models import read_tensor_type_counts

WEIGHT_SCALE = 0.02  # normal(0, 0.02): activations stay finite through every layer; norms are 1

# --- the shapes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The hyper-parameters that decide a model's tensors (and so its speed), as llama.cpp reads them.

    ``context_length`` is what the file claims, not necessarily the real model's (Llama 3.2's 131072 would
    make a default context no machine here can hold).
    """

    name: str
    description: str  # the real model this is the shape of
    arch: str  # llama.cpp's architecture name (general.architecture)
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    rms_eps: float
    context_length: int
    head_dim: int = 0  # 0: n_embd // n_head
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2)
    tied_embeddings: bool = True  # no output.weight: the output projection reuses token_embd

    @property
    def key_length(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        """Parameters of all tensors, as llama.cpp and the real model's card count them."""
        return sum(int(np.prod(t.shape)) for t in tensor_plan(self))


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("llama-1b", "Llama 3.2 1B", "llama", n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192,
               n_vocab=128256, rope_theta=500000.0, rms_eps=1e-5, context_length=8192),
    ModelShape("qwen2.5-0.5b", "Qwen2.5 0.5B", "qwen2", n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864,
               n_vocab=151936, rope_theta=1000000.0, rms_eps=1e-6, context_length=32768, qkv_bias=True),
    ModelShape("smollm2-135m", "SmolLM2 135M", "llama", n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536,
               n_vocab=49152, rope_theta=100000.0, rms_eps=1e-5, context_length=8192),
    # For tests: rows of 256, so that K-quants apply to every matrix.
    ModelShape("test-256", "a tiny llama for tests", "llama", n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512,
               n_vocab=1024, rope_theta=10000.0, rms_eps=1e-5, context_length=2048),
)}


# --- the file types ------------------------------------------------------------------------------------------

# Names as llama.cpp's llama-quantize spells them (lower case), and its file types.
QUANT_TYPES: dict[str, str] = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
}


# --- tensors -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write: numpy shape (llama.cpp's ne reversed) and what fills it."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "matrix" (F16, random), "bias" (F32, random) or "norm" (F32, ones)

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == "matrix" else np.float32


def tensor_plan(shape: ModelShape) -> list[TensorSpec]:
    """The tensors of ``shape`` in file order, named as llama.cpp's loader for its architecture expects."""
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

    arch = next((a for a, n in MODEL_ARCH_NAMES.items() if n == shape.arch), None)
    if arch is None:
        raise ValueError(f"gguf knows no architecture {shape.arch!r}")
    known = MODEL_TENSORS[arch]

    def spec(tensor: MODEL_TENSOR, suffix: str, dims: tuple[int, ...], kind: str, bid: int = 0) -> TensorSpec:
        if tensor not in known:  # a typo in a new layout shows here, not as llama.cpp's "missing tensor"
            raise ValueError(f"{shape.arch} has no tensor {TENSOR_NAMES[tensor]}")
        return TensorSpec(f"{TENSOR_NAMES[tensor].format(bid=bid)}.{suffix}", dims, kind)

    d, q, kv, ff = shape.n_embd, shape.n_head * shape.key_length, shape.n_head_kv * shape.key_length, shape.n_ff
    plan = [spec(MODEL_TENSOR.TOKEN_EMBD, "weight", (shape.n_vocab, d), "matrix"),
            spec(MODEL_TENSOR.OUTPUT_NORM, "weight", (d,), "norm")]
    if not shape.tied_embeddings:
        plan.append(spec(MODEL_TENSOR.OUTPUT, "weight", (shape.n_vocab, d), "matrix"))
    for i in range(shape.n_layer):
        plan += [
            spec(MODEL_TENSOR.ATTN_NORM, "weight", (d,), "norm", i),
            spec(MODEL_TENSOR.ATTN_Q, "weight", (q, d), "matrix", i),
            spec(MODEL_TENSOR.ATTN_K, "weight", (kv, d), "matrix", i),
            spec(MODEL_TENSOR.ATTN_V, "weight", (kv, d), "matrix", i),
        ]
        if shape.qkv_bias:
            plan += [
                spec(MODEL_TENSOR.ATTN_Q, "bias", (q,), "bias", i),
                spec(MODEL_TENSOR.ATTN_K, "bias", (kv,), "bias", i),
                spec(MODEL_TENSOR.ATTN_V, "bias", (kv,), "bias", i),
            ]
        plan += [
            spec(MODEL_TENSOR.ATTN_OUT, "weight", (d, q), "matrix", i),
            spec(MODEL_TENSOR.FFN_NORM, "weight", (d,), "norm", i),
            spec(MODEL_TENSOR.FFN_GATE, "weight", (ff, d), "matrix", i),
            spec(MODEL_TENSOR.FFN_UP, "weight", (ff, d), "matrix", i),
            spec(MODEL_TENSOR.FFN_DOWN, "weight", (d, ff), "matrix", i),
        ]
    return plan


# --- the vocabulary ------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, BOS, EOS
_PIECE_ALPHABET = "▁" + string.ascii_lowercase  # SentencePiece writes a space as ▁


def _pieces() -> Iterator[str]:
    """Every string over ▁a-z, shortest first: ▁, a .. z, ▁▁, ▁a .. zz, ▁▁▁ ...; each one's halves come earlier,
    so the tokenizer can merge letters into the longer pieces."""
    for n in itertools.count(1):
        for letters in itertools.product(_PIECE_ALPHABET, repeat=n):
            yield "".join(letters)


def byte_vocab(n_vocab: int) -> list[str]:
    """A SentencePiece vocabulary of exactly ``n_vocab`` tokens: the special tokens, the 256 byte tokens
    (any text can be spelled), then pieces over ▁a-z."""
    n_fixed = len(SPECIAL_TOKENS) + 256
    if n_vocab <= n_fixed:
        raise ValueError(f"a byte-level vocabulary needs more than {n_fixed} tokens, not {n_vocab}")
    return (list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(256)]
            + list(itertools.islice(_pieces(), n_vocab - n_fixed)))


def add_byte_vocab(writer: Any, n_vocab: int) -> None:
    """Write ``byte_vocab(n_vocab)`` as a llama (SentencePiece) tokenizer to a ``gguf.GGUFWriter``."""
    tokens = byte_vocab(n_vocab)
    n_pieces = n_vocab - len(SPECIAL_TOKENS) - 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * (n_vocab - n_pieces) + [-float(i) for i in range(n_pieces)])  # short first
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * n_pieces)  # unknown, control, byte, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


# --- building ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltModel:
    """A file ``build_shape`` wrote, with the type llama.cpp gave each tensor."""

    path: Path
    shape: ModelShape
    quant_type: str  # a QUANT_TYPES key
    size_bytes: int
    tensor_types: dict[str, int]  # ggml type name ("Q4_K", "F32") -> tensors of that type
    seconds: float

    @property
    def n_tensors(self) -> int:
        return sum(self.tensor_types.values())


def write_f16(shape: ModelShape, path: Path, seed: int = 0) -> Path:
    """``shape`` with seeded random weights: F16 matrices, F32 norms (ones) and biases."""
    import gguf

    plan = tensor_plan(shape)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"{shape.name} (random weights)")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.key_length)
    writer.add_value_length(shape.key_length)
    writer.add_rope_dimension_count(shape.key_length)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_byte_vocab(writer, shape.n_vocab)
    for t in plan:  # the table first, then the data one tensor at a time
        writer.add_tensor_info(t.name, t.shape, np.dtype(t.dtype), int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for t in plan:
        if t.kind == "norm":
            data = np.ones(t.shape, dtype=np.float32)
        else:
            data = rng.standard_normal(t.shape, dtype=np.float32)
            data *= WEIGHT_SCALE
        writer.write_tensor_data(data.astype(t.dtype, copy=False))
        del data
    writer.close()
    return path


def quantize(src: Path, dst: Path, quant_type: str, threads: int | None = None) -> None:
    """Quantize the GGUF ``src`` to ``dst`` with llama.cpp's own quantizer (llama-quantize's rules)."""
    from .cpus import cpu_report
    from .native import quantize_model

    quantize_model(src, dst, QUANT_TYPES[quant_type], threads or cpu_report().logical)


def build_shape(
    shape: ModelShape, path: str | os.PathLike[str], quant_type: str = "q4_k_m", seed: int = 0,
    threads: int | None = None, progress: Callable[[str], None] | None = None,
) -> BuiltModel:
    """Write ``shape`` with random weights to ``path`` as ``quant_type`` (a QUANT_TYPES key).

    The F16 file is written next to ``path`` and removed after quantizing (unless F16 was asked for);
    a build that fails leaves neither behind.
    """
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"unknown type {quant_type!r} (one of {', '.join(QUANT_TYPES)})")
    say = progress or (lambda _msg: None)
    out = Path(path)
    f16 = out if quant_type == "f16" else out.with_name(out.name + ".f16.part")
    start = time.perf_counter()
    try:
        say(f"writing {shape.name} ({shape.n_params / 1e6:.0f}M parameters) as F16 with random weights")
        write_f16(shape, f16, seed)
        if f16 != out:
            say(f"quantizing to {quant_type.upper()} with llama.cpp")
            quantize(f16, out, quant_type, threads)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    finally:
        if f16 != out:
            f16.unlink(missing_ok=True)
    return BuiltModel(out, shape, quant_type, out.stat().st_size, read_tensor_type_counts(out),
                      time.perf_counter() - start)
