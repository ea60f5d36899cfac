"""What the library calls a model and what lookahead it gets, from its GGUF header and file name alone."""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.units import Word

# llama.cpp's llm_arch_is_recurrent / llm_arch_is_hybrid (src/llama-arch.cpp), by the names
# llama-arch.cpp gives these architectures in GGUF files. Their memory keeps one state per
# sequence: no lookahead window, and a rejected guess can be dropped only where llama.cpp keeps
# earlier states to go back to (llm_arch_supports_rs_rollback): those verify one draft per step
# ("drafts only", engine/decoding/runtime.py), the others decode plainly. The header's architecture says
# which before loading; the loaded engine says the same.
RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
})
ROLLBACK_ARCHITECTURES = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
    "lfm2", "lfm2moe", "bailingmoe3",
})
DRAFTS_ONLY_NOTE = (
    "Drafts only: this model's memory is recurrent in part, so each step checks one guessed continuation and "
    "takes back what is rejected; the lookahead window is not used."
)
# GGUF files that are not language models: a vision model's projector (llama.cpp's mtmd "clip").
NOT_A_LANGUAGE_MODEL = {"clip": "a vision projector (mmproj) for another model, not a language model"}
NOT_A_LANGUAGE_MODEL_PLAIN = (
    "This file is an add-on for another model (it lets that model see images), not a chat model."
)


def lookahead_block_reason(architecture: str) -> str | None:
    """Why a model of this architecture cannot run lookahead (None: it can), from its name alone."""
    if architecture in RECURRENT_ARCHITECTURES or architecture in HYBRID_ARCHITECTURES:
        if architecture in ROLLBACK_ARCHITECTURES:
            return None
        kind = "recurrent" if architecture in RECURRENT_ARCHITECTURES else "hybrid"
        return (f"llama.cpp cannot take back rejected guesses from the {kind} memory of its architecture "
                f"({architecture}); plain decoding still works")
    return None


class LookaheadKind(Word):
    """What lookahead a model gets."""

    FULL = "lookahead"  # the Jacobi window and the drafts
    DRAFTS_ONLY = "drafts only"  # one guess per step, no window (hybrid models that can take back a guess)
    PLAIN = "plain"  # none: plain decoding


def lookahead_kind(architecture: str) -> LookaheadKind:
    """What lookahead a model of this architecture gets."""
    if lookahead_block_reason(architecture):
        return LookaheadKind.PLAIN
    if architecture in RECURRENT_ARCHITECTURES or architecture in HYBRID_ARCHITECTURES:
        return LookaheadKind.DRAFTS_ONLY
    return LookaheadKind.FULL


def lookahead_cell(kind: str) -> str:
    """A ``lookahead_kind`` as the library's column says it: "yes", "drafts only" or "no"."""
    cells: dict[str, str] = {LookaheadKind.FULL: "yes", LookaheadKind.DRAFTS_ONLY: "drafts only"}
    return cells.get(kind, "no")


# A word of a GGUF's general.name that marks a training run rather than a model people would name:
# epochs, steps, checkpoints, data mixes, seeds, learning rates (e.g. "Smollm2 135M 8k Lc100K Mix1 Ep2").
_TRAINING_TAG = re.compile(
    r"^(?:ep|epoch|step|steps|iter|ckpt|checkpoint|mix|lc|seed|run|lr|bs|gs|globalstep)\d[\w.]*$"
    r"|^(?:ckpt|checkpoint|tmp\w*)$",
    re.IGNORECASE,
)
_HEX_ID = re.compile(r"^(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}$", re.IGNORECASE)  # a commit or run id
# Names that say nothing about which model it is: a converter's or trainer's default.
_GENERIC_NAMES = frozenset({"model", "models", "hf", "temp", "output", "out", "merged", "base", "pytorch", "gguf",
                            "final", "unsloth", "default", "untitled"})


def name_is_training_tag(name: str) -> bool:
    """Whether a GGUF's general.name is a training run's tag or a tool's default rather than a model's name."""
    words = [w for w in re.split(r"[\s_/\\]+|(?<=\D)-|-(?=\D)", name.strip()) if w]
    if not words:
        return True
    if any(_TRAINING_TAG.match(w) or _HEX_ID.match(w) for w in words):
        return True
    return all(w.casefold() in _GENERIC_NAMES for w in words)


def friendly_name(gguf_name: str | None, path: str | os.PathLike[str]) -> str:
    """The name to show for a model file: its general.name, unless missing or a training tag; then the
    file's name without .gguf ("SmolLM2-135M-Instruct.Q4_1"). The library and the status bar both use it."""
    if gguf_name and gguf_name.strip() and not name_is_training_tag(gguf_name):
        return gguf_name.strip()
    return Path(path).stem
