"""Models built in the test (random weights, another size than the bundled model): text stays plain decoding's
in every mode, and a model whose batches are never exact is refused drafts with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Engine, GenerationControls, LookaheadConfig, StopConfig
from engine.decoding.settings import DEFAULT_LOOKAHEAD
from engine.llama import native
from tests.helpers.planning import FLAT, auto_on_curve
from tests.helpers.tiny_models import write_tiny_llama

# Auto on the engine's own curve (the tiny model's measured one, or the reference curve CI pins).
pytestmark = pytest.mark.auto

MODES = [
    pytest.param(DEFAULT_LOOKAHEAD, id="auto"),
    pytest.param(LookaheadConfig(window=3, ngram=4, guesses=3), id="W3-N4-G3"),
    pytest.param(LookaheadConfig(window=0, ngram=5, guesses=4), id="W0-N5-G4"),
]


@pytest.fixture(scope="module")
def tiny_llama_engine(tmp_path_factory):
    # Q4_1: what these tests check is exactness and drafting, so the weights are of a type whose batches give
    # 1-token logits on every x86 CPU with our llama.cpp (F16's are exact up to some size on one CPU, at no size
    # on another, and one thread and two disagree there).
    path = write_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny-llama-q4_1.gguf", weights="q4_1")
    with Engine(path, n_ctx=2048, n_threads=2) as eng:
        eng.tune()
        yield eng


def generate(eng: Engine, text: str, lookahead: LookaheadConfig | None) -> tuple[list[int], int]:
    eng.reset()
    controls = GenerationControls(lookahead=lookahead)
    events = list(eng.generate(eng.tokenize(text), controls, stop=StopConfig(max_tokens=96)))
    assert events[-1].stop_reason in ("max_tokens", "eog")
    return [t for ev in events for t in ev.token_ids], sum(ev.n_drafted for ev in events)


def test_the_cost_curve_is_measured_for_the_model_loaded(tiny_llama_engine):
    curve = tiny_llama_engine.cost_curve
    assert tiny_llama_engine.costs.curve_measured
    assert curve.cost(1) == 1.0 and curve.cost(16) > curve.cost(2) >= 1.0
    assert curve.max_exact_batch >= 16 and curve.threads_agree


@pytest.mark.parametrize("lookahead", MODES)
def test_lookahead_gives_plain_decodings_text_on_a_tiny_q4_1_llama(tiny_llama_engine, lookahead):
    drafted = 0
    for text in ("abc", "hello world", "the cat sat on the mat"):
        plain, _ = generate(tiny_llama_engine, text, None)
        # Auto on the flat curve drafts whenever it has a draft, whatever this CPU's batches cost.
        with auto_on_curve(tiny_llama_engine, FLAT):
            out, n = generate(tiny_llama_engine, text, lookahead)
        assert out == plain, text
        drafted += n
    assert drafted > 0  # drafts were verified: the comparison had work to check


def test_a_model_with_16_dimension_heads_gives_plain_decodings_text_past_256_cached_tokens(tmp_path):
    """Heads of 16 dimensions, in the f16 cache every model gets, and a prompt past 256 cells.

    Q4_1 weights, so that only the attention over that cache decides whether a batch is exact: where the probe
    finds none that is, every step is plain and says why.
    """
    path = write_tiny_llama(tmp_path / "tiny-llama-head16.gguf", n_embd=64, weights="q4_1")
    with Engine(path, n_ctx=1024, n_threads=2) as eng:
        assert eng.ctx.kv_type == "f16"
        prompt = eng.tokenize("the cat sat on the mat " * 40)
        assert len(prompt) > 256
        eng.reset()
        plain = [t for ev in eng.generate(prompt, stop=StopConfig(max_tokens=64)) for t in ev.token_ids]
        for lookahead in (DEFAULT_LOOKAHEAD, LookaheadConfig(window=0, ngram=5, guesses=4)):
            eng.reset()
            with auto_on_curve(eng, FLAT):  # Auto drafts whenever it has a draft and the batch is exact
                events = list(eng.generate(prompt, GenerationControls(lookahead=lookahead),
                                           stop=StopConfig(max_tokens=64)))
            assert [t for ev in events for t in ev.token_ids] == plain
            if eng.cost_curve.max_exact_batch < 2:
                assert all(ev.batch_size == 1 for ev in events)
                assert "no batch gives" in events[0].choice


def test_a_model_whose_batches_never_give_its_1_token_logits_is_refused_drafts_and_says_why(tmp_path, monkeypatch):
    """F16 on some CPUs has no exact batch at all. Here a kernel that moves every row of a batch by one ulp
    stands in for one, so the probe finds it on any CPU: lookahead then runs plain steps and says why."""
    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))  # no cost curve from another test
    real_decode = native.Context.decode

    def inexact_batches(ctx: native.Context, batch: native.Batch) -> None:
        real_decode(ctx, batch)
        n_out = int(np.count_nonzero(batch.logits[: batch.n_tokens]))
        if batch.n_tokens > 1 and n_out:
            rows = ctx.logits_rows(n_out)
            rows[:] = np.nextafter(rows, np.float32(np.inf))

    path = write_tiny_llama(tmp_path / "tiny-llama-q4_1.gguf", weights="q4_1")
    with Engine(path, n_ctx=1024, n_threads=2) as eng:
        prompt = eng.tokenize("the cat sat on the mat")
        plain = [t for ev in eng.generate(prompt, stop=StopConfig(max_tokens=32)) for t in ev.token_ids]
        monkeypatch.setattr(native.Context, "decode", inexact_batches)
        assert eng.probe_exact_cap() < 2
        for lookahead in (DEFAULT_LOOKAHEAD, LookaheadConfig(window=0, ngram=5, guesses=4)):
            eng.reset()
            events = list(eng.generate(prompt, GenerationControls(lookahead=lookahead), stop=StopConfig(max_tokens=32)))
            assert [t for ev in events for t in ev.token_ids] == plain
            assert all(ev.batch_size == 1 and ev.n_drafted == 0 for ev in events)
            assert all("no batch gives this model's logits of plain decoding" in ev.choice for ev in events)
