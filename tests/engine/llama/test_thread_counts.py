"""A step's logits do not depend on how many threads compute it.

llama.cpp splits a matmul's rows and the attention's work among its threads, and the patches keep every output's
arithmetic whatever the split. The attention splits a 1-token step's rows (one per query head) among threads, so
a GQA group's rows can land on two threads (the bundled model: 3 groups of 3 heads over 2 threads); where a model
has fewer groups than threads (one KV head, as Gemma 3 270M), patch part 7 has the threads share the keys' tiles
and then the value columns instead. Plain decoding and verification both rest on the results being the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import Engine
from tests.helpers.tiny_models import write_tiny_llama

DEPTH = 300  # past several 64-cell attention tiles
STEPS = 4
TEXT = "The lighthouse keeper counted the ships that passed the rocks each night, and wrote their names down. " * 20


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("one-kv-head") / "tiny-1kv.gguf", weights="q4_1", n_head_kv=1))


def logits_of_steps(model_path: str, n_threads: int, k: int) -> list[np.ndarray]:
    """The logits of STEPS steps of k tokens each after DEPTH cached tokens, each step keeping its first token."""
    eng = Engine(model_path, n_ctx=1024, n_threads=n_threads)
    try:
        tokens = eng.tokenize(TEXT)
        assert len(tokens) >= DEPTH + STEPS + k
        eng.cache.prefill(tokens[:DEPTH])
        batch = eng.loaded.batch
        rows = []
        for pos in range(DEPTH, DEPTH + STEPS):
            batch.set_single_seq(tokens[pos : pos + k], pos, eng.loaded.commit_seqs, last_logits=True)
            batch.logits[:k] = 1
            eng.ctx.decode(batch)
            rows.append(eng.ctx.logits_rows(k).copy())
            eng.ctx.seq_rm(-1, pos + 1, -1)
        return rows
    finally:
        eng.close()


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("which", ["bundled", "one KV head"])
def test_a_step_gives_the_same_logits_bit_for_bit_on_one_two_and_three_threads(
    model_path: Path, one_kv_head_model: str, which: str, k: int
) -> None:
    path = str(model_path) if which == "bundled" else one_kv_head_model
    one, two, three = (logits_of_steps(path, n, k) for n in (1, 2, 3))
    for step, (a, b, c) in enumerate(zip(one, two, three, strict=True)):
        assert a.shape == (k, b.shape[1])
        assert np.isfinite(a).all()
        assert np.array_equal(a, b), f"step {step}: 2 threads differ from 1"
        assert np.array_equal(a, c), f"step {step}: 3 threads differ from 1"
