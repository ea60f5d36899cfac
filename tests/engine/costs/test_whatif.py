"""What-if cost curves: the shipped ones hold their derivation, and Auto plans and prices on them."""

from __future__ import annotations

import json

import pytest

from engine import GenerationControls, Message, RunStats, StopConfig
from engine.costs.curve import CostCurve
from engine.costs.whatif import CurveFileError, Roofline, load_curve, save_curve
from engine.decoding.acceptance import AcceptanceStats
from engine.decoding.settings import DEFAULT_LOOKAHEAD
from engine.speed.run_stats import priced, simulated_speedup
from tests.helpers.planning import LAPTOP_CURVES, laptop_curve

GIB = 1024**3


def test_the_example_laptop_curves_numbers_follow_from_their_stated_inputs():
    files = sorted(LAPTOP_CURVES.glob("*.json"))
    assert len(files) >= 2
    for path in files:
        obj = json.loads(path.read_text(encoding="utf-8"))
        assert obj["what_if"] is True and obj["sources"] and obj["model"] and obj["machine"]
        derived = Roofline.from_json(obj["roofline"]).curve()
        assert load_curve(path) == derived, path.name
        # An 8-core laptop's curve is flat where this project's 2-core machines are steep (c(4) 2.0-2.8 there).
        assert derived.cost(4) < 1.3 and derived.cost(8) < 2.0


def test_the_roofline_reproduces_a_published_small_batch_measurement():
    # Llama 3.1 8B Q4_K_M, 12 CPU threads, llama-bench: tg128 8.52 t/s; pp4 27.18, pp8 32.01, pp16 35.13,
    # pp32 34.57, pp512 36.5 t/s (github.com/ZJkyle/Cache, experiment/README.md). A pp batch asks for one logit row.
    emb = 128256 * 4096
    head_bytes = emb * 210 / 256
    body_bytes = 4.58 * GIB - head_bytes - emb * 144 / 256
    body_params = 8.03e9 - 2 * emb
    kv = 32 * 2 * 8 * 128 * 2
    r = Roofline(body_bytes=body_bytes, head_bytes=head_bytes, body_params=body_params, head_params=emb,
                 kv_bytes_per_token=kv, context=64, bandwidth=(body_bytes + head_bytes + 64 * kv) * 8.52,
                 compute=512 * 2 * body_params / (512 / 36.5), threads=12)
    for n, rate in ((4, 27.18), (8, 32.01), (16, 35.13), (32, 34.57)):
        measured = (n / rate) * 8.52  # the batch's time over a 1-token step's
        assert r.seconds(n, 1) / r.seconds(1, 1) == pytest.approx(measured, rel=0.06), n


def test_curve_files_round_trip_and_bad_ones_are_refused_with_a_reason(tmp_path):
    curve = CostCurve(sizes=(1, 2, 4), last_logit=(1.0, 1.1, 1.3), all_logits=(1.0, 1.2, 1.5), base_ms=9.0,
                      threads=8, max_exact_batch=16)
    save_curve(curve, tmp_path / "mine.json", model="test")
    assert load_curve(tmp_path / "mine.json") == curve
    assert laptop_curve("laptop-8core-llama3.2-3b-q4_k_m").base_ms > 0
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "other.json").write_text('{"sizes": [1, 2]}', encoding="utf-8")
    for name, words in (("missing.json", "no such curve file"), ("bad.json", "cannot read"),
                        ("other.json", "not a cost curve")):
        with pytest.raises(CurveFileError, match=words):
            load_curve(tmp_path / name)


def test_a_simulated_speedup_prices_each_run_per_token_on_the_curve():
    curve = CostCurve(sizes=(1, 2, 4), last_logit=(1.0, 1.5, 2.0), all_logits=(1.0, 1.5, 2.0), base_ms=10.0,
                      threads=2)
    plain = RunStats(n_tokens=8, shapes=[(1, 1)] * 8)
    # Four 2-token steps (1.5 each) for the same eight tokens: 8 / 6.
    paired = RunStats(n_tokens=8, shapes=[(2, 2)] * 4)
    assert priced(paired, curve) == pytest.approx(6.0)
    assert simulated_speedup(plain, paired, curve) == pytest.approx(8 / 6)
    assert simulated_speedup(plain, RunStats(), curve) == 0.0


def _auto_run(engine, curve, prompt):
    engine.acceptance = AcceptanceStats()  # the same starting point: no acceptance learned before
    engine.plan_with(curve)
    engine.reset()
    events = list(engine.generate(prompt, GenerationControls(lookahead=DEFAULT_LOOKAHEAD),
                                  stop=StopConfig(max_tokens=64)))
    return RunStats.of(events), events


@pytest.mark.model
def test_auto_plans_the_same_steps_on_the_same_curve_and_uses_the_window_where_batches_are_cheap(engine):
    laptop = laptop_curve("laptop-8core-llama3.1-8b-q4_k_m")
    prompt = engine.render_chat([Message("user", "List the planets of the solar system with one fact each.")])
    first, events = _auto_run(engine, laptop, prompt)
    second, _ = _auto_run(engine, laptop, prompt)
    assert first.shapes == second.shapes and first.token_ids == second.token_ids
    assert engine.costs.curve_source == "what-if"
    assert any(ev.window > 0 for ev in events), [ev.choice for ev in events]
    engine.plan_with(None)  # back to this machine's curve, for the tests after this one
    assert engine.costs.curve_source != "what-if"
    plain = RunStats.of(engine.generate(prompt, GenerationControls(), stop=StopConfig(max_tokens=64)))
    assert plain.token_ids == first.token_ids


@pytest.mark.model
def test_a_pinned_reference_curve_replaces_the_measurement_and_no_step_time_corrects_it(
    model_path, monkeypatch, tmp_path
):
    from engine import Engine
    from engine.costs.curve import REFERENCE_CURVES

    steep = REFERENCE_CURVES["steep"]
    monkeypatch.setenv("LOOKAHEAD_COST_CURVE", "steep")
    with Engine(model_path, n_ctx=1024, n_threads=2) as eng:
        assert eng.cost_curve.all_logits == steep.all_logits and not eng.costs.live_costs.learn
        curve = eng.tune()  # only the exact-batch probe runs: which batches are exact is this CPU's
        assert eng.costs.curve_source == "pinned" and eng.costs.curve_measured
        assert curve.all_logits == steep.all_logits and curve.max_exact_batch >= 16
        prompt = eng.render_chat([Message("user", "Repeat after me: one two three four five six.")])
        list(eng.generate(prompt, GenerationControls(lookahead=DEFAULT_LOOKAHEAD), stop=StopConfig(max_tokens=24)))
        assert eng.costs.live_costs.observed() == {}
        eng.plan_with(laptop_curve("laptop-8core-llama3.1-8b-q4_k_m"))
        eng.plan_with(None)  # back to the pinned curve, not to a measured or the default one
        assert eng.costs.curve_source == "pinned" and eng.cost_curve == curve
    # A curve file works as well as a name; anything else is refused with the variable named.
    path = tmp_path / "mine.json"
    save_curve(REFERENCE_CURVES["flat"], path)
    monkeypatch.setenv("LOOKAHEAD_COST_CURVE", str(path))
    with Engine(model_path, n_ctx=1024, n_threads=2) as eng:
        assert eng.cost_curve.all_logits == REFERENCE_CURVES["flat"].all_logits
    monkeypatch.setenv("LOOKAHEAD_COST_CURVE", "no-such-curve")
    with pytest.raises(CurveFileError, match="LOOKAHEAD_COST_CURVE='no-such-curve'.*steep, flat"):
        Engine(model_path, n_ctx=1024, n_threads=2)
