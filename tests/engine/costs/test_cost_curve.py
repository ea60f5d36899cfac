import pytest

from engine.costs.curve import CostCurve, LiveCosts, load_cached, save_cached
from engine.tools.bench import oracle_bound, perfect_draft_bound

CURVE = CostCurve(sizes=(1, 2, 4, 8), last_logit=(1, 1.5, 2.0, 3.0), all_logits=(1, 1.6, 2.4, 4.0), base_ms=10,
                  threads=2)


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


def test_a_curve_measured_with_another_llama_cpp_build_is_measured_again(tmp_path, monkeypatch):
    # new kernels change both what a batch costs and which batches are exact
    from engine.llama import backend

    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(backend, "build_id", lambda: "libggml-cpu.so:1000:1")
    save_cached(str(model), 2, CURVE)
    assert load_cached(str(model), 2) == CURVE
    monkeypatch.setattr(backend, "build_id", lambda: "libggml-cpu.so:1200:2")
    assert load_cached(str(model), 2) is None


def test_the_build_id_names_the_libraries_in_use():
    from engine.llama import backend

    assert "ggml-cpu" in backend.build_id()


def test_oracle_bound_rewards_output_that_copies_the_prompt():
    context = list(range(10, 30)) + [5]
    copied = list(range(10, 30))
    # After "5" nothing matches yet; once "10" is out, every later token was seen after its predecessor.
    bound = oracle_bound(context, copied, CURVE)
    assert bound > 1.5
    assert oracle_bound(context, [99, 98, 97, 96], CURVE) == pytest.approx(1.0)


def test_perfect_drafts_bound_is_the_best_tokens_per_cost():
    assert perfect_draft_bound(CURVE, max_len=8) == pytest.approx(max(4 / 2.4, 8 / 4.0, 2 / 1.6))


def with_base(step_s: float = 0.010) -> LiveCosts:
    """Live costs that have seen enough 1-token steps of ``step_s`` to have a base."""
    live = LiveCosts(CURVE)
    for _ in range(10):
        live.record(1, 1, step_s)
    return live


def test_live_costs_move_towards_what_batches_really_cost():
    live = LiveCosts(CURVE)
    live.record(2, 2, 0.030)  # no base yet: nothing to compare with
    assert live.cost(2) == pytest.approx(1.6)
    for _ in range(10):
        live.record(1, 1, 0.010)
    for _ in range(24):
        live.record(2, 2, 0.020)  # a 2-token step really costs 2.0x here
    assert 1.85 < live.cost(2) < 2.0
    # The sizes not run are priced on the curve scaled as the ones run say: 2.0 is 1.67x the curve's 0.6 beyond 1.
    assert 1.5 < live.scale() < 1.67
    assert live.cost(4, 1) == pytest.approx(1 + (CURVE.cost(4, 1) - 1) * live.scale())
    assert live.cost(4) == pytest.approx(1 + (CURVE.cost(4) - 1) * live.scale())
    assert live.cost(1) == 1.0
    assert live.observed() == {2: (round(live.cost(2), 3), 24)}


def test_a_batch_whose_rows_a_grammar_gives_teaches_its_size_with_the_curves_price_of_the_logits_it_left_out():
    live = with_base()
    for _ in range(24):
        live.record(4, 1, 0.030)  # 3.0x with one logit; the curve says 2.0, and 2.4 with all four
    assert 2.9 < live.cost(4, 1) < 3.0  # mostly the 3.0 seen, as a batch with all logits would be
    assert live.cost(4) == pytest.approx(live.cost(4, 1) + CURVE.cost(4) - CURVE.cost(4, 1))
    assert live.cost(4, 2) == pytest.approx(live.cost(4) - (CURVE.cost(4) - CURVE.cost(4, 2)))
    assert live.observed() == {4: (round(live.cost(4), 3), 24)}
    for _ in range(24):
        live.record(3, 0, 0.012)  # every row given: priced as one logit, far below the curve's 2.0 for 3 rows
    assert live.cost(3, 0) < 1.4 and live.cost(3, 1) == live.cost(3, 0)


def test_a_token_the_grammar_gave_put_into_the_cache_alone_is_no_1_token_step():
    live = with_base(0.010)
    for _ in range(30):
        live.record(1, 0, 0.004)  # no logits asked for: cheaper than a step, and not one
    assert live.in_steps(0.020, 2, 2) == pytest.approx(2.0)  # the base is still the 1-token steps' 10 ms


def test_a_steps_measured_time_reads_in_1_token_steps_once_there_are_enough_of_those():
    live = LiveCosts(CURVE)
    assert live.in_steps(0.5, 4, 4) == pytest.approx(2.4)  # no 1-token steps yet: the batch's price
    for seconds in (0.010, 0.012, 0.011, 0.010, 0.009, 0.010, 0.030, 0.010):  # one slow outlier
        live.record(1, 1, seconds)
    assert live.in_steps(0.025, 4, 4) == pytest.approx(2.5)  # over the median 1-token step, 10 ms


def test_the_slower_step_after_a_batch_is_charged_to_the_batch():
    live = with_base()
    for _ in range(24):
        live.record(2, 2, 0.020)
        live.record(1, 1, 0.015)  # half a step more than the base: the batch's doing
        live.record(1, 1, 0.010)
    assert 2.4 < live.cost(2) < 2.5  # 2.5 blended with the curve's (scaled) 1.6; 1.9 if the batch were timed alone
    # the slow steps did not move the base: a batch at twice the base still reads as about 2.0 more
    live2 = with_base()
    for _ in range(20):
        live2.record(2, 2, 0.020)
        live2.record(1, 1, 0.030)
    for _ in range(30):
        live2.record(4, 4, 0.020)
    assert live2.cost(4) == pytest.approx(0.25 * (1 + (CURVE.cost(4) - 1) * live2.scale()) + 0.75 * 2.0)
    assert live2.cost(4) < 2.1


def test_a_batch_size_not_run_yet_never_looks_cheaper_than_a_smaller_one_that_was():
    live = with_base()
    for _ in range(24):
        live.record(4, 4, 0.060)  # 6.0x here, far above the curve
    assert live.cost(4) > 4.5
    assert live.cost(5) >= live.cost(4) and live.cost(6, 2) >= live.cost(4)
    assert CURVE.cost(3) < live.cost(3) == pytest.approx(1 + (CURVE.cost(3) - 1) * live.scale())  # scaled alike


def test_live_costs_follow_a_cheaper_machine_too():
    live = with_base()
    for _ in range(4):
        live.record(2, 2, 0.012)
    assert 1.2 < live.cost(2) < 1.6  # a few samples move it part of the way


def test_batches_that_cost_more_than_the_curve_says_raise_the_price_of_sizes_not_run_yet_and_less_lower_it():
    # A cache deeper than the curve was timed at: every batch costs 25% more beyond a 1-token step.
    deeper = with_base()
    for _ in range(12):
        deeper.record(2, 2, 0.010 * (1 + 0.6 * 1.25))
        deeper.record(4, 4, 0.010 * (1 + 1.4 * 1.25))
    assert deeper.scale() == pytest.approx(1 + 0.25 * 24 / (24 + LiveCosts.SHARED_PRIOR))
    assert deeper.cost(8) == pytest.approx(1 + (CURVE.cost(8) - 1) * deeper.scale())
    assert CURVE.cost(8) < deeper.cost(8) < 1 + (CURVE.cost(8) - 1) * 1.25
    # A machine where batches are cheaper than measured: the same, downwards.
    cheaper = with_base()
    for _ in range(12):
        cheaper.record(2, 2, 0.010 * (1 + 0.6 * 0.5))
    assert cheaper.cost(8) < CURVE.cost(8) and cheaper.cost(8) >= cheaper.cost(2)
    # One batch moves the shared scale only a little.
    once = with_base()
    once.record(4, 4, 0.010 * (1 + 1.4 * 2.0))
    assert 1.0 < once.scale() < 1.2


def test_a_what_if_curve_is_never_scaled():
    fixed = LiveCosts(CURVE, learn=False)
    for _ in range(10):
        fixed.record(1, 1, 0.010)
    for _ in range(10):
        fixed.record(4, 4, 0.050)
    assert fixed.scale() == 1.0 and fixed.cost(8) == CURVE.cost(8)
