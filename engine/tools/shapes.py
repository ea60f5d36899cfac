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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.llama.models import read_tensor_type_counts

WEIGHT_SCALE = 0.02  # normal(0, 0.02): activations stay finite through every layer; norms are 1
CONV_SCALE = 0.2  # a convolution kernel of 3 or 4 taps: its output keeps the size of its input

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
    # Hybrid memory: per layer "a" (attention) or "r" (recurrent); "" = attention in every layer.
    layers: str = ""
    conv_kernel: int = 0  # a recurrent layer's convolution width (LFM2's short conv, Qwen3.5's delta net)
    ssm_heads: int = 0  # Qwen3.5's delta net: value heads (one state matrix each) ...
    ssm_groups: int = 0  # ... key heads ...
    ssm_head_dim: int = 0  # ... and the width of each
    rope_dims: int = 0  # rotated dimensions of a head (0: all of them)
    rope_sections: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.layers and (len(self.layers) != self.n_layer or set(self.layers) - {"a", "r"}):
            raise ValueError(f"{self.name}: layers must give 'a' or 'r' for each of its {self.n_layer} layers")

    def recurrent(self, i: int) -> bool:
        return bool(self.layers) and self.layers[i] == "r"

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
    # The models AI PCs run, 3-8B (each real model's config.json; Llama 3.2 3B and Qwen2.5 3B tie their output).
    ModelShape("llama-3b", "Llama 3.2 3B", "llama", n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, n_ff=8192,
               n_vocab=128256, rope_theta=500000.0, rms_eps=1e-5, context_length=8192),
    ModelShape("llama-8b", "Llama 3.1 8B", "llama", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336,
               n_vocab=128256, rope_theta=500000.0, rms_eps=1e-5, context_length=8192, tied_embeddings=False),
    ModelShape("qwen2.5-3b", "Qwen2.5 3B", "qwen2", n_embd=2048, n_layer=36, n_head=16, n_head_kv=2, n_ff=11008,
               n_vocab=151936, rope_theta=1000000.0, rms_eps=1e-6, context_length=32768, qkv_bias=True),
    ModelShape("qwen2.5-7b", "Qwen2.5 7B", "qwen2", n_embd=3584, n_layer=28, n_head=28, n_head_kv=4, n_ff=18944,
               n_vocab=152064, rope_theta=1000000.0, rms_eps=1e-6, context_length=32768, qkv_bias=True,
               tied_embeddings=False),
    ModelShape("qwen2.5-0.5b", "Qwen2.5 0.5B", "qwen2", n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864,
               n_vocab=151936, rope_theta=1000000.0, rms_eps=1e-6, context_length=32768, qkv_bias=True),
    ModelShape("smollm2-135m", "SmolLM2 135M", "llama", n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536,
               n_vocab=49152, rope_theta=100000.0, rms_eps=1e-5, context_length=8192),
    # Hybrid memory. LFM2: short-convolution layers and attention (config.json's full_attn_idxs), the feed-forward
    # width after its block_auto_adjust_ff_dim; Qwen3.5: three Gated DeltaNet layers to one of gated attention.
    ModelShape("lfm2-1.2b", "LFM2 1.2B", "lfm2", n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192,
               n_vocab=65536, rope_theta=1000000.0, rms_eps=1e-5, context_length=32768,
               layers="rrarrarrarararar", conv_kernel=3),
    ModelShape("qwen3.5-0.8b", "Qwen3.5 0.8B (its language model)", "qwen35", n_embd=1024, n_layer=24, n_head=8,
               n_head_kv=2, n_ff=3584, n_vocab=248320, rope_theta=10000000.0, rms_eps=1e-6, context_length=32768,
               head_dim=256, layers="rrra" * 6, conv_kernel=4, ssm_heads=16, ssm_groups=16, ssm_head_dim=128,
               rope_dims=64, rope_sections=(11, 11, 10, 0)),
    # For tests: rows of 256, so that K-quants apply to every matrix.
    ModelShape("test-256", "a tiny llama for tests", "llama", n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512,
               n_vocab=1024, rope_theta=10000.0, rms_eps=1e-5, context_length=2048),
    # Tiny hybrids for tests: [recurrent, attention, recurrent], a vocabulary of the bytes, ▁ and a-z.
    ModelShape("test-lfm2", "a tiny LFM2 for tests", "lfm2", n_embd=128, n_layer=3, n_head=2, n_head_kv=1, n_ff=256,
               n_vocab=286, rope_theta=1000000.0, rms_eps=1e-5, context_length=1024, tied_embeddings=False,
               layers="rar", conv_kernel=3),
    ModelShape("test-qwen35", "a tiny Qwen3.5 for tests", "qwen35", n_embd=128, n_layer=3, n_head=2, n_head_kv=1,
               n_ff=256, n_vocab=286, rope_theta=10000000.0, rms_eps=1e-5, context_length=1024, head_dim=64,
               tied_embeddings=False, layers="rar", conv_kernel=4, ssm_heads=4, ssm_groups=2, ssm_head_dim=32,
               rope_dims=32, rope_sections=(6, 5, 5, 0)),
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
    # "matrix" (F16, random), "bias" (F32, random), "norm" (F32, ones), "conv" (F32, a random convolution
    # kernel), "decay" (F32, a delta net's negative log decay per head), "dt_bias" (F32, uniform in ±1)
    kind: str

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == "matrix" else np.float32

    def values(self, rng: np.random.Generator) -> np.ndarray:
        """Seeded contents: small enough that activations stay finite through every layer."""
        if self.kind == "norm":
            return np.ones(self.shape, dtype=np.float32)
        if self.kind == "decay":
            return -np.exp(rng.uniform(-1.0, 0.5, self.shape)).astype(np.float32)
        if self.kind == "dt_bias":
            return rng.uniform(-1.0, 1.0, self.shape).astype(np.float32)
        data = rng.standard_normal(self.shape, dtype=np.float32)
        data *= CONV_SCALE if self.kind == "conv" else WEIGHT_SCALE
        return data.astype(self.dtype, copy=False)


def tensor_plan(shape: ModelShape) -> list[TensorSpec]:
    """The tensors of ``shape`` in file order, named as llama.cpp's loader for its architecture expects.

    One table, kept in one piece: its order is the file's."""
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

    arch = next((a for a, n in MODEL_ARCH_NAMES.items() if n == shape.arch), None)
    if arch is None:
        raise ValueError(f"gguf knows no architecture {shape.arch!r}")
    known = MODEL_TENSORS[arch]

    def spec(tensor: MODEL_TENSOR, suffix: str, dims: tuple[int, ...], kind: str, bid: int = 0) -> TensorSpec:
        if tensor not in known:  # a typo in a new layout shows here, not as llama.cpp's "missing tensor"
            raise ValueError(f"{shape.arch} has no tensor {TENSOR_NAMES[tensor]}")
        name = TENSOR_NAMES[tensor].format(bid=bid)
        return TensorSpec(f"{name}.{suffix}" if suffix else name, dims, kind)

    tn = MODEL_TENSOR
    d, hd, ff = shape.n_embd, shape.key_length, shape.n_ff
    q, kv = shape.n_head * hd, shape.n_head_kv * hd
    final_norm = tn.TOKEN_EMBD_NORM if shape.arch == "lfm2" else tn.OUTPUT_NORM  # LFM2's final norm has that name
    plan = [spec(tn.TOKEN_EMBD, "weight", (shape.n_vocab, d), "matrix"), spec(final_norm, "weight", (d,), "norm")]
    if not shape.tied_embeddings:
        plan.append(spec(tn.OUTPUT, "weight", (shape.n_vocab, d), "matrix"))
    for i in range(shape.n_layer):
        plan.append(spec(tn.ATTN_NORM, "weight", (d,), "norm", i))
        if shape.arch == "qwen35":
            plan.append(spec(tn.ATTN_POST_NORM, "weight", (d,), "norm", i))
        if shape.recurrent(i) and shape.arch == "lfm2":
            k = shape.conv_kernel
            plan += [spec(tn.SHORTCONV_CONV, "weight", (d, k), "conv", i),
                     spec(tn.SHORTCONV_INPROJ, "weight", (3 * d, d), "matrix", i),
                     spec(tn.SHORTCONV_OUTPROJ, "weight", (d, d), "matrix", i)]
        elif shape.recurrent(i):  # Qwen3.5's Gated DeltaNet
            heads, key_dim = shape.ssm_heads, shape.ssm_groups * shape.ssm_head_dim
            value_dim = heads * shape.ssm_head_dim
            conv = 2 * key_dim + value_dim
            plan += [spec(tn.ATTN_QKV, "weight", (conv, d), "matrix", i),
                     spec(tn.ATTN_GATE, "weight", (value_dim, d), "matrix", i),
                     spec(tn.SSM_CONV1D, "weight", (conv, shape.conv_kernel), "conv", i),
                     spec(tn.SSM_DT, "bias", (heads,), "dt_bias", i),
                     spec(tn.SSM_A, "", (heads,), "decay", i),
                     spec(tn.SSM_BETA, "weight", (heads, d), "matrix", i),
                     spec(tn.SSM_ALPHA, "weight", (heads, d), "matrix", i),
                     spec(tn.SSM_NORM, "weight", (shape.ssm_head_dim,), "norm", i),
                     spec(tn.SSM_OUT, "weight", (d, value_dim), "matrix", i)]
        else:
            gated = shape.arch == "qwen35"  # Qwen3.5's q projection carries q and its output gate
            plan += [spec(tn.ATTN_Q, "weight", (2 * q if gated else q, d), "matrix", i),
                     spec(tn.ATTN_K, "weight", (kv, d), "matrix", i),
                     spec(tn.ATTN_V, "weight", (kv, d), "matrix", i)]
            if shape.qkv_bias:
                plan += [spec(tn.ATTN_Q, "bias", (q,), "bias", i),
                         spec(tn.ATTN_K, "bias", (kv,), "bias", i),
                         spec(tn.ATTN_V, "bias", (kv,), "bias", i)]
            if shape.arch in ("lfm2", "qwen35"):
                plan += [spec(tn.ATTN_Q_NORM, "weight", (hd,), "norm", i),
                         spec(tn.ATTN_K_NORM, "weight", (hd,), "norm", i)]
            plan.append(spec(tn.ATTN_OUT, "weight", (d, q), "matrix", i))
        if shape.arch != "qwen35":
            plan.append(spec(tn.FFN_NORM, "weight", (d,), "norm", i))
        plan += [spec(tn.FFN_GATE, "weight", (ff, d), "matrix", i),
                 spec(tn.FFN_UP, "weight", (ff, d), "matrix", i),
                 spec(tn.FFN_DOWN, "weight", (d, ff), "matrix", i)]
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


def add_byte_vocab(writer: Any, n_vocab: int, control: Sequence[str] = ()) -> None:
    """Write ``byte_vocab(n_vocab)`` as a llama (SentencePiece) tokenizer to a ``gguf.GGUFWriter``, then the
    ``control`` tokens (a chat format's turn markers, say) after it."""
    tokens = byte_vocab(n_vocab)
    n_pieces = n_vocab - len(SPECIAL_TOKENS) - 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens + list(control))
    writer.add_token_scores([0.0] * (n_vocab - n_pieces) + [-float(i) for i in range(n_pieces)] + [0.0] * len(control))
    # unknown, control, byte, normal, then the extra control tokens
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * n_pieces + [3] * len(control))
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
    """``shape`` with seeded random weights: F16 matrices, F32 norms (ones), biases and recurrent parameters."""
    import gguf

    plan = tensor_plan(shape)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"{shape.name} (random weights)")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    if shape.arch == "lfm2":  # a short-conv layer is one without key/value heads
        writer.add_head_count_kv([0 if shape.recurrent(i) else shape.n_head_kv for i in range(shape.n_layer)])
        writer.add_shortconv_l_cache(shape.conv_kernel)
    else:
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_key_length(shape.key_length)
        writer.add_value_length(shape.key_length)
    writer.add_rope_dimension_count(shape.rope_dims or shape.key_length)
    if shape.rope_sections:
        writer.add_rope_dimension_sections(list(shape.rope_sections))
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    if shape.arch == "qwen35":  # its loader places the attention layers by their interval
        interval = shape.layers.index("a") + 1
        if shape.layers != (("r" * (interval - 1) + "a") * shape.n_layer)[: shape.n_layer]:
            raise ValueError(f"{shape.name}: a qwen35 model has an attention layer every n layers")
        writer.add_full_attention_interval(interval)
        writer.add_ssm_conv_kernel(shape.conv_kernel)
        writer.add_ssm_inner_size(shape.ssm_heads * shape.ssm_head_dim)
        writer.add_ssm_state_size(shape.ssm_head_dim)
        writer.add_ssm_time_step_rank(shape.ssm_heads)
        writer.add_ssm_group_count(shape.ssm_groups)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_byte_vocab(writer, shape.n_vocab)
    for t in plan:  # the table first, then the data one tensor at a time
        writer.add_tensor_info(t.name, t.shape, np.dtype(t.dtype), int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for t in plan:
        writer.write_tensor_data(t.values(rng))
    writer.close()
    return path


def quantize(src: Path, dst: Path, quant_type: str, threads: int | None = None) -> None:
    """Quantize the GGUF ``src`` to ``dst`` with llama.cpp's own quantizer (llama-quantize's rules)."""
    from engine.costs.cpus import cpu_report
    from engine.llama.native import quantize_model

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
