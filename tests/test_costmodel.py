import pytest

from engine.bench import oracle_bound, perfect_draft_bound
from engine.costmodel import CostCurve, load_cached, save_cached

CURVE = CostCurve(sizes=(1, 2, 4, 8), last_logit=(1, 1.5, 2.0, 3.0), all_logits=(1, 1.6, 2.4, 4.0), base_ms=10, threads=2)


def test_cost_interpolates_between_measured_sizes_and_logit_counts():
    assert CURVE.cost(1) == 1.0
    assert CURVE.cost(2) == pytest.approx(1.6)
    assert CURVE.cost(3) == pytest.approx(2.0)
    assert CURVE.cost(4, 1) == pytest.approx(2.0)
    assert CURVE.cost(4, 4) == pytest.approx(2.4)
    assert CURVE.cost(16) > CURVE.cost(8)  # extrapolated beyond the last size


def test_curves_are_cached_per_model_file_and_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    assert load_cached(str(model), 2) is None
    save_cached(str(model), 2, CURVE)
    assert load_cached(str(model), 2) == CURVE
    assert load_cached(str(model), 4) is None


def test_oracle_bound_rewards_output_that_copies_the_prompt():
    context = list(range(10, 30)) + [5]
    copied = list(range(10, 30))
    # After "5" nothing matches yet; once "10" is out, every later token was seen after its predecessor.
    bound = oracle_bound(context, copied, CURVE)
    assert bound > 1.5
    assert oracle_bound(context, [99, 98, 97, 96], CURVE) == pytest.approx(1.0)


def test_perfect_drafts_bound_is_the_best_tokens_per_cost():
    assert perfect_draft_bound(CURVE, max_len=8) == pytest.approx(max(4 / 2.4, 8 / 4.0, 2 / 1.6))
