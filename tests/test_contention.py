"""Another program busy on a core: the thread governor, what it keeps out of Auto's costs, the measurement."""

from __future__ import annotations

import threading

import pytest

from engine import GenerationControls, LookaheadConfig, Message, StopConfig
from engine.contention import MAX_RETRY_S, PROBE_DECODES, RETRY_S, WINDOW, DecodeSample, ThreadGovernor
from engine.costmodel import MachineBusy, MeasurementCancelled, curve_for, load_cached
from engine.runtime import PREFILL_CHUNK, PREFILL_FIRST_CHUNK
from tests.planning import FLAT, auto_on_curve


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(threads: int, utilization: float = 1.0, ms: float = 10.0, cost: float = 1.0) -> DecodeSample:
    wall = ms / 1000
    return DecodeSample(wall=wall, cpu=wall * threads * utilization, threads=threads, cost=cost)


def feed(gov: ThreadGovernor, samples: list[DecodeSample]) -> list[int]:
    return [gov.observe(s) for s in samples]


def test_a_busy_core_costs_one_thread_after_a_few_slow_decodes():
    gov = ThreadGovernor(2, clock=Clock())
    asked = feed(gov, [sample(2, 0.75, ms=25) for _ in range(WINDOW)])
    assert asked[:3] == [2, 2, 2] and asked[3] == 1  # the fourth contended decode drops a thread
    assert gov.threads == 1 and gov.reduced
    assert gov.notice() == "Another program is busy: using 1 of 2 cores"
    assert not gov.steady


def test_an_idle_pc_keeps_every_thread_through_the_odd_late_wakeup():
    gov = ThreadGovernor(2, clock=Clock())
    # Measured idle: most decodes at 1.00, about one in a hundred down to 0.82..0.85.
    series = [sample(2, 0.82 if i % 7 == 0 else 0.97) for i in range(300)]
    assert set(feed(gov, series)) == {2}
    assert gov.reductions == 0 and gov.steady and gov.notice() == ""


def test_one_more_thread_is_tried_later_and_kept_only_when_faster():
    clock = Clock()
    gov = ThreadGovernor(2, clock=clock)
    feed(gov, [sample(2, 0.7, ms=30) for _ in range(4)])
    assert gov.threads == 1
    feed(gov, [sample(1, 1.0, ms=20) for _ in range(WINDOW)])
    assert gov.threads == 1  # too early to try again
    clock.now += RETRY_S
    assert gov.observe(sample(1, 1.0, ms=20)) == 2  # the trial starts with the next decode
    assert not gov.steady  # trial steps do not teach Auto's costs
    # The other program is still there: two threads are slower, so the trial is undone...
    asked = feed(gov, [sample(2, 0.7, ms=30) for _ in range(PROBE_DECODES)])
    assert asked[-1] == 1 and gov.threads == 1
    # ...and tried again later, after twice the wait.
    clock.now += RETRY_S
    assert set(feed(gov, [sample(1, 1.0, ms=20) for _ in range(WINDOW)])) == {1}
    clock.now += RETRY_S
    assert gov.observe(sample(1, 1.0, ms=20)) == 2
    # The program ended: two threads are faster and kept.
    asked = feed(gov, [sample(2, 1.0, ms=12) for _ in range(PROBE_DECODES)])
    assert asked[-1] == 2 and gov.threads == 2 and not gov.reduced


def test_trial_speed_is_compared_per_unit_of_expected_cost():
    """A trial that happened to run bigger batches is not taken for a slower one."""
    clock = Clock()
    gov = ThreadGovernor(2, clock=clock)
    feed(gov, [sample(2, 0.7) for _ in range(4)])
    clock.now += MAX_RETRY_S
    feed(gov, [sample(1, 1.0, ms=20, cost=1.0) for _ in range(WINDOW)])
    assert gov.observe(sample(1, 1.0, ms=20)) == 2
    feed(gov, [sample(2, 1.0, ms=30, cost=2.5) for _ in range(PROBE_DECODES)])  # 12 ms per unit against 20
    assert gov.threads == 2


def test_a_governor_that_may_not_adapt_keeps_its_threads():
    gov = ThreadGovernor(2, adapt=False, clock=Clock())
    assert set(feed(gov, [sample(2, 0.5) for _ in range(50)])) == {2}


def test_decodes_too_short_to_judge_never_count_as_contended():
    gov = ThreadGovernor(2, clock=Clock())
    assert set(feed(gov, [sample(2, 0.3, ms=0.5) for _ in range(50)])) == {2}  # a tiny model's late wake-ups
    assert sample(2, 0.3, ms=10).contended


def test_one_thread_has_nothing_to_give_up():
    gov = ThreadGovernor(1, clock=Clock())
    assert set(feed(gov, [sample(1, 0.5) for _ in range(50)])) == {1}
    assert gov.notice() == ""


# --- on the bundled model -------------------------------------------------------------------------------------


def starved(engine, share: float):
    """Make every decode look as if its threads had their cores ``share`` of the time (1.0: an idle PC),
    whatever else this machine is running."""
    real = engine._after_decode

    def after(batch, wall, _cpu):
        real(batch, wall, wall * engine.ctx.n_threads * share)

    return after


@pytest.fixture
def governed(engine):
    """The session engine with a 2-thread governor that may adapt, restored after."""
    saved = (engine.governor, engine.threads_agree, engine.ctx.on_decode, engine.n_threads, engine.threads_chosen)
    engine.governor = ThreadGovernor(2)
    engine.threads_agree, engine.n_threads, engine.threads_chosen = True, 2, True
    engine.ctx.set_threads(2)
    yield engine
    engine.governor, engine.threads_agree, engine.ctx.on_decode, engine.n_threads, engine.threads_chosen = saved
    engine.ctx.set_threads(engine.n_threads)


def generate(engine, prompt, lookahead, max_tokens=80):
    engine.reset()
    controls = GenerationControls(lookahead=lookahead)
    return list(engine.generate(prompt, controls, stop=StopConfig(max_tokens=max_tokens)))


@pytest.mark.model
def test_steps_of_a_busy_pc_teach_auto_nothing_and_the_text_stays_that_of_plain_decoding(governed):
    engine = governed
    prompt = engine.render_chat([Message("user", "List the planets of the solar system, one per line.")])
    engine.ctx.on_decode = starved(engine, 1.0)
    plain = generate(engine, prompt, None)
    assert {e.threads for e in plain} == {2}
    engine.ctx.on_decode = starved(engine, 0.6)
    with auto_on_curve(engine, FLAT):
        engine.live_costs.learn = True  # a measured curve's live costs learn; these steps must not teach them
        events = generate(engine, prompt, LookaheadConfig(auto=True))
        assert engine.live_costs.observed() == {}
    assert [e.threads for e in events[:2]] == [2, 2]
    assert events[-1].threads == 1 and events[-1].max_threads == 2 and events[-1].contended
    assert engine.governor.reductions >= 1
    assert sum(e.n_drafted for e in events) > 0  # the thread change happened under lookahead, not plain steps
    assert [t for e in events for t in e.token_ids] == [t for e in plain for t in e.token_ids]


@pytest.mark.model
def test_without_contention_auto_still_learns_its_live_costs(governed):
    engine = governed
    prompt = engine.render_chat([Message("user", "Count from one to thirty in words.")])
    with auto_on_curve(engine, FLAT):
        engine.live_costs.learn = True
        engine.ctx.on_decode = starved(engine, 1.0)
        generate(engine, prompt, LookaheadConfig(auto=True), max_tokens=120)
        assert engine.live_costs.observed() != {}


@pytest.mark.model
def test_a_measurement_taken_while_the_pc_is_busy_is_stopped_and_not_kept(governed, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))
    engine = governed
    engine.ctx.on_decode = starved(engine, 0.5)
    with pytest.raises(MachineBusy) as info:
        curve_for(engine, refresh=True, budget_s=1.0)
    assert isinstance(info.value, MeasurementCancelled)  # callers that stop on a cancel stop here too
    assert info.value.max_exact_batch is not None and info.value.max_exact_batch >= 2
    assert load_cached(engine.summary.path, engine.n_threads) is None
    assert engine.threads_in_use == 2  # the measurement ran on every thread and left them so


@pytest.mark.model
def test_the_probe_finds_that_one_thread_gives_the_same_logits(engine):
    from engine.costmodel import QUICK_PROBE_SIZES, probe_exact_batch

    engine.threads_agree = None
    saved = engine.n_threads
    engine.n_threads = 2  # the check compares every thread against one
    try:
        probe_exact_batch(engine, sizes=QUICK_PROBE_SIZES[:2])
    finally:
        engine.n_threads = saved
        engine.ctx.set_threads(saved)
    assert engine.threads_agree is True


@pytest.mark.model
def test_a_long_prompt_is_read_in_chunks_with_progress_and_stop_works_between_them(engine):
    words = " ".join(f"item{i}" for i in range(200))  # ~730 tokens: more than 8 chunks
    prompt = engine.render_chat([Message("user", f"Summarise this list: {words}")])
    assert len(prompt) > 8 * PREFILL_CHUNK
    seen: list[tuple[int, int]] = []
    engine.reset()
    events = list(engine.generate(prompt, GenerationControls(on_prompt=lambda d, t: seen.append((d, t))),
                                  stop=StopConfig(max_tokens=2)))
    total = len(prompt) - 1
    assert seen[-1] == (total, total)
    assert all(t == total for _, t in seen)
    steps = [b - a for (a, _), (b, _) in zip([(0, 0), *seen], seen, strict=False)]
    assert steps[0] == PREFILL_FIRST_CHUNK < PREFILL_CHUNK  # the first progress comes soon
    assert max(steps) <= PREFILL_CHUNK and len(seen) >= total // PREFILL_CHUNK
    assert events[0].prefill_tokens == total

    cancel = threading.Event()
    read_when_stopped: list[int] = []

    def stop_after_three(done: int, _total: int) -> None:
        if done >= 3 * PREFILL_CHUNK and not cancel.is_set():
            read_when_stopped.append(done)
            cancel.set()

    engine.reset()
    controls = GenerationControls(cancel=cancel, on_prompt=stop_after_three)
    events = list(engine.generate(prompt, controls, stop=StopConfig(max_tokens=2)))
    assert [e.stop_reason for e in events] == ["cancelled"]
    assert engine.kv.n == read_when_stopped[0] < total  # what was read stays cached for the next try
    assert engine.kv.tokens == prompt[: engine.kv.n]
