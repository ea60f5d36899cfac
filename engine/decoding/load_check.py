"""The child process of engine/llama/probe.py: load a model file as the engine does, up to its first token.

``python -m engine.decoding.load_check PATH --ctx N --threads N`` (a frozen app: ``--engine-probe``, see
packaging/launch.py). It opens the engine's own context (``open_context``), so a file that passes here loads in
the app; if llama.cpp aborts or the memory runs out, this process dies, not the app.
"""

from __future__ import annotations

import sys

import numpy as np

from engine.decoding.loaded import open_context
from engine.llama.native import Batch, Model
from engine.llama.probe import run_child

PROBE_TEXT = "Hello, world!\n"  # tokenized (with special tokens) and decoded


def load_and_decode(path: str, n_ctx: int, n_threads: int) -> None:
    """What the engine does when it opens a model, up to its first token.

    Load, context, tokenize, decode, detokenize.
    """
    model = Model(path)
    try:
        ctx = open_context(model, n_ctx, n_threads)
        try:
            tokens = model.tokenize(PROBE_TEXT, add_special=True, parse_special=True)[:8] or [0]
            batch = Batch(max(len(tokens), 1), n_seq=1)
            batch.set_single_seq(tokens, 0, (0,), last_logits=True)
            ctx.decode(batch)
            best = int(np.argmax(ctx.logits_at(len(tokens) - 1)))
            model.token_bytes(best)
            model.is_eog(best)
            model.token_text(best)
        finally:
            ctx.close()
    finally:
        model.close()


def main(argv: list[str] | None = None) -> int:
    return run_child(argv, load_and_decode)


if __name__ == "__main__":
    sys.exit(main())
