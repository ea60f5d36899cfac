"""Which llama.cpp matmul kernel serves a model's batches on this build, and what that means for lookahead.

A step keeps a guessed token only if its row of logits is bit for bit the one a 1-token step gives, so the
batches a step may use are those whose matmuls keep the 1-token arithmetic. Which those are depends on the
weights' types, the CPU and the build: our llama.cpp patches (packaging/llama-cpp-patches/) give Q4_1, Q4_K,
Q6_K, Q8_0, Q5_0, Q5_K, Q4_0, IQ4_NL and Q5_1 kernels whose rows never depend on the batch size, and the build names
them in its system info (``batch_kernels``); other types keep llama.cpp's, and some of those switch to another
float order at some batch size. The exact-batch probe (``costs.exactness.probe_exact_batch``) measures what holds for
a model; this module names why, for ``engine tune`` and the app's model info.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass

EVERY_SIZE = None  # ``exact_up_to`` of a kernel that keeps the 1-token arithmetic at every batch size


@dataclass(frozen=True)
class MatrixKernel:
    """How the weight matrices of one type are multiplied by a batch on this build."""

    ggml_type: str  # "Q4_K"
    n_tensors: int
    kernel: str  # what runs, in a few words
    exact_up_to: int | None  # the largest batch known to give 1-token results, or EVERY_SIZE; 0: not known

    @property
    def describe(self) -> str:
        if self.exact_up_to is EVERY_SIZE:
            exact = "every batch size gives 1-token results"
        elif self.exact_up_to == 0:
            exact = "batches are checked on the model"
        else:
            exact = f"batches of more than {self.exact_up_to} tokens can round differently"
        return f"{self.ggml_type} ({self.n_tensors}): {self.kernel}; {exact}"


# What the patched build says of its batch kernels (BATCH_KERNELS in its system info, one "TYPE kernel" item per
# weight type whose batches give 1-token results at every size; packaging/llama-cpp-patches/), in words.
_PATCHED = {
    "tile": "one-pass tile kernel (patched)",
    "tile-batches": "one-pass tile kernel for batches, vec_dot's arithmetic (patched)",
    "repacked": "repacked 4-row kernel in the 1-token order (patched)",
    "vec_dot-256": "one row at a time up to 256 tokens (patched)",
    "repacked-batches": "llama.cpp's repacked rows, up to 16 tokens in one pass, in its 1-token order (patched)",
}

# llama.cpp's own x86 kernels for the types the patches leave alone, as in the vendored version:
# the K-quants and i-quants below take its tiled path from 8 tokens (another float order than vec_dot's).
_TILED_FROM_8 = {"Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
                 "IQ1_M"}


def batch_kernels(features: Mapping[str, str]) -> dict[str, str]:
    """The weight types whose batches keep the 1-token arithmetic at every size on this build, as the build itself
    names them ({"Q4_1": "tile-batches", ...}); empty for a llama.cpp without our patches."""
    kernels = {}
    for item in features.get("BATCH_KERNELS", "").split(","):
        words = item.split()
        if len(words) == 2:
            kernels[words[0]] = words[1]
    return kernels


def _x86_upstream_kernel(ggml_type: str, avx2: bool) -> tuple[str, int | None]:
    if ggml_type == "Q4_0" and avx2:
        return "llama.cpp's repacked kernel", EVERY_SIZE
    if ggml_type == "Q4_K" and avx2:
        return "llama.cpp's repacked kernel, another order from 4 tokens", 3
    if ggml_type in _TILED_FROM_8:
        return "llama.cpp's tiled kernel from 8 tokens", 7
    if ggml_type == "IQ4_NL" and avx2:
        # repacked where the row count is a multiple of 8 (one order), tinyBLAS for a batch elsewhere (another)
        return "llama.cpp's repacked kernel where the rows allow, tinyBLAS elsewhere", 0
    if ggml_type in ("IQ4_NL", "Q8_0", "Q5_0", "F16", "BF16", "F32"):
        # one token takes vec_dot, two or more llama.cpp's tinyBLAS: another order
        return "llama.cpp's kernels (one for a token, another for a batch)", 1
    return "llama.cpp's kernels", 0


def matrix_kernels(
    type_counts: Mapping[str, int], features: Mapping[str, str], machine: str | None = None,
) -> list[MatrixKernel]:
    """The kernel of each weight type in ``type_counts`` (matrices only) on a build with these ``features``
    (``system_features()``: its CPU features and, if patched, its BATCH_KERNELS), most tensors first."""
    machine = (machine or platform.machine()).lower()
    x86 = machine in ("x86_64", "amd64", "i686", "x86")
    avx2 = features.get("AVX2") == "1" and features.get("FMA") == "1"
    patched = batch_kernels(features)
    out = []
    for ggml_type, n in sorted(type_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if ggml_type in patched:
            code = patched[ggml_type]
            kernel, exact = _PATCHED.get(code, f"{code} (patched)"), EVERY_SIZE
        elif x86:
            kernel, exact = _x86_upstream_kernel(ggml_type, avx2)
        else:
            kernel, exact = "llama.cpp's kernels (the patches change x86 only)", 0
        out.append(MatrixKernel(ggml_type, n, kernel, exact))
    return out


def explain_exact_limit(kernels: list[MatrixKernel], max_exact_batch: int, largest_probed: int) -> str:
    """One sentence on the largest exact batch the probe found, and which weights set it when they are known to."""
    if max_exact_batch >= largest_probed:
        return f"batches up to {max_exact_batch} tokens (all sizes probed) give logits identical to a 1-token step"
    limiting = [k.ggml_type for k in kernels if k.exact_up_to == max_exact_batch]
    if max_exact_batch == 0:
        head = "no batch gives logits identical to a 1-token step, so lookahead is off for this model"
    else:
        head = f"batches up to {max_exact_batch} tokens give logits identical to a 1-token step"
    if limiting:
        return f"{head}: llama.cpp's kernels for {', '.join(limiting)} weights round larger batches differently"
    return f"{head}; larger ones round differently on this CPU"
