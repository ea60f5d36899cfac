"""Tiny GGUF models written with gguf's GGUFWriter: other architectures and shapes than the bundled model.

Random weights, a byte-level SPM vocabulary (bytes plus ▁ and a-z, engine/tools/shapes.py's), in the tensor
shapes llama.cpp expects (numpy shape = llama.cpp's ne reversed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.tools.shapes import add_byte_vocab, byte_vocab

if TYPE_CHECKING:
    import gguf

TOKENS = byte_vocab(3 + 256 + 27)  # <unk> <s> </s>, the bytes, then ▁ and a-z


def _random_weights(seed: int) -> Callable[..., np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return w


def _finish(writer: gguf.GGUFWriter, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_mamba(path: Path, context_length: int = 1024) -> Path:
    """A 2-layer Mamba model with random weights and a byte-level SPM vocabulary, in the shapes llama.cpp expects.

    Mamba's memory is recurrent: llama.cpp cannot drop a few positions from it, so lookahead must be refused.
    """
    import gguf

    n_embd, d_inner, d_state, d_conv, dt_rank, n_layer = 32, 64, 8, 4, 4, 2
    n_vocab = len(TOKENS)
    w = _random_weights(0)

    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_name("tiny-mamba-test")
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_ssm_dt_b_c_rms(False)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_byte_vocab(writer, len(TOKENS))
    writer.add_tensor("token_embd.weight", w(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", w(n_vocab, n_embd))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ssm_in.weight", w(2 * d_inner, n_embd))
        writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", w(d_inner, d_conv))
        writer.add_tensor(f"blk.{i}.ssm_conv1d.bias", w(d_inner))
        writer.add_tensor(f"blk.{i}.ssm_x.weight", w(dt_rank + 2 * d_state, d_inner))
        writer.add_tensor(f"blk.{i}.ssm_dt.weight", w(d_inner, dt_rank))
        writer.add_tensor(f"blk.{i}.ssm_dt.bias", w(d_inner))
        writer.add_tensor(f"blk.{i}.ssm_a", -np.exp(w(d_inner, d_state)))
        writer.add_tensor(f"blk.{i}.ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ssm_out.weight", w(n_embd, d_inner))
    return _finish(writer, path)


def write_tiny_llama(
    path: Path,
    context_length: int = 2048,
    weights: str = "f16",
    n_embd: int = 128,
    name: str = "tiny-llama-test",
    n_head_kv: int = 2,
    control_tokens: Sequence[str] = (),
) -> Path:
    """A 2-layer llama-architecture model (grouped-query attention, SwiGLU), F16 matrices by default.

    ``weights``: "f16", "f32" or "q4_1" (the bundled model's type: with the patched llama.cpp its batches give
    1-token logits on every x86 CPU, where F16's are exact on some CPUs and on others at no size at all).
    ``name`` is its ``general.name``; ``n_head_kv`` its KV heads (of 4 query heads); ``control_tokens`` are added
    to its vocabulary as control tokens (a chat format's turn markers).

    Its greedy text is repetitive, so lookahead has drafts to verify; in F16 or F32 its matrices take other
    kernels than the bundled Q4_1 model's.
    """
    import gguf

    # Four query heads, of 32 dimensions by default (n_embd=64 makes them 16).
    n_head, n_ff, n_layer = 4, 128, 2
    head_dim = n_embd // n_head
    n_vocab = len(TOKENS) + len(control_tokens)
    w = _random_weights(1)

    file_type, qtype = {
        "f16": (gguf.LlamaFileType.MOSTLY_F16, None),
        "f32": (gguf.LlamaFileType.ALL_F32, None),
        "q4_1": (gguf.LlamaFileType.MOSTLY_Q4_1, gguf.GGMLQuantizationType.Q4_1),
    }[weights]

    def add_matrix(name: str, *shape: int) -> None:
        x = w(*shape, scale=0.3)
        if qtype is not None:
            writer.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, x.astype(np.float16) if weights == "f16" else x)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(file_type)
    add_byte_vocab(writer, len(TOKENS), control_tokens)
    writer.add_tensor("token_embd.weight", w(n_vocab, n_embd, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    add_matrix("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add_matrix(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        add_matrix(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        add_matrix(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
        add_matrix(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add_matrix(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        add_matrix(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        add_matrix(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    return _finish(writer, path)


# --- hybrid memory: attention layers beside recurrent ones ------------------------------------------------------


def write_tiny_hybrid(arch: str, path: Path, seed: int = 0, quant: str = "q4_1") -> Path:
    """A 3-layer ``arch`` ("lfm2" or "qwen35") model with random weights (engine/tools/shapes.py's test-lfm2 and
    test-qwen35: layers [recurrent, attention, recurrent]), quantized by llama.cpp to ``quant`` ("f16": none).

    Q4_1 by default: its batch rows equal 1-token steps; F16/F32 matmuls do not.
    """
    from engine.tools.shapes import SHAPES, build_shape

    if f"test-{arch}" not in SHAPES:
        raise ValueError(f"no tiny {arch} model (lfm2, qwen35)")
    return build_shape(SHAPES[f"test-{arch}"], path, quant, seed=seed, threads=1).path
