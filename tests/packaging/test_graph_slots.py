"""Patch part 8 (packaging/llama-cpp-patches/08-small-batch-graphs.patch): llama.cpp keeps a compute graph for
each small batch size, so a 1-token step after a short batch, and the next batch of that size, reuse theirs; a
reused graph gives the logits a graph built again gives."""

from __future__ import annotations

import llama_cpp as ll
import numpy as np
import pytest

from engine.llama.native import Batch, Context, Model

PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest to look for"
# Step sizes as lookahead decoding has them: 1-token steps with short batches between, a batch size coming back.
STEPS = (1, 1, 3, 1, 3, 1, 2, 1, 3, 1, 12, 1)


def _graphs_reused(ctx: Context) -> int:
    return int(ll.llama_perf_context(ctx.ptr).n_reused)


def _run(model: Model, steps: tuple[int, ...]) -> tuple[list[np.ndarray], int]:
    """Decodes the prompt, then one step of each size in ``steps`` (every row with logits, each step's tokens
    committed): each step's logits, and how many of the steps reused a graph."""
    ctx = Context(model, n_ctx=512, n_batch=64, n_threads=2, n_seq_max=1)
    try:
        batch = Batch(64, 1)
        tokens = model.tokenize(PROMPT, add_special=True)
        batch.set_single_seq(tokens, 0, [0], last_logits=True)
        ctx.decode(batch)
        before = _graphs_reused(ctx)
        pos, out = len(tokens), []
        for k, n in enumerate(steps):
            step_tokens = [tokens[(k + j) % len(tokens)] for j in range(n)]
            batch.set_single_seq(step_tokens, pos, [0], last_logits=True)
            batch.logits[:n] = 1
            ctx.decode(batch)
            out.append(ctx.logits_rows(n).copy())
            pos += n
        return out, _graphs_reused(ctx) - before
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def model(model_path):
    m = Model(str(model_path))
    yield m
    m.close()


def test_a_1_token_step_after_a_short_batch_and_a_batch_size_seen_before_reuse_their_graphs(model):
    _, reused = _run(model, STEPS)
    # Built: the first 1-token step and the first batch of 3, of 2 and of 12 (a batch of more than 8 tokens
    # takes the slot of the prompt's graph, so even the 1-token step after it finds its own graph). Upstream
    # reuses only the graph of the step just before, once: 1.
    assert reused == len(STEPS) - 4, reused


def test_a_reused_graph_gives_the_logits_a_graph_built_for_the_step_gives(model, monkeypatch):
    reused_logits, reused = _run(model, STEPS)
    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")  # read when a context is made
    built_logits, none = _run(model, STEPS)
    assert none == 0 and reused > 0
    for k, (a, b) in enumerate(zip(reused_logits, built_logits, strict=True)):
        assert np.array_equal(a, b), f"step {k} (of {STEPS[k]} tokens): logits differ"
