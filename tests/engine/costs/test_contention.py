"""Another program busy on a core: the thread governor, what it keeps out of Auto's costs, the measurement."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from engine import GenerationControls, LookaheadConfig, Message, StopConfig
from engine.costs.calibration import MachineBusy, MeasurementCancelled, curve_for
from engine.costs.contention import (
    BUSY_UTILIZATION,
    MAX_RETRY_S,
    PROBE_DECODES,
    RETRY_S,
    WINDOW,
    CpuLoad,
    DecodeSample,
    RestProfile,
    ThreadGovernor,
    waiting_share,
)
from engine.costs.curve import load_cached
from engine.decoding.prompt_cache import PREFILL_CHUNK
from tests.helpers.planning import FLAT, STEEP, auto_on_curve


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


class Load:
    """Other programs' use of 2 CPUs as the OS would report it (contention.CpuLoad.others); None: unknown."""

    capacity = 2

    def __init__(self, others: float | None) -> None:
        self.value = others

    def others(self) -> float | None:
        return self.value


def governor(load: float | None = None, rest: RestProfile | None = None, clock: Clock | None = None, max_threads=2):
    return ThreadGovernor(max_threads, clock=clock or Clock(), rest=rest, load=Load(load))  # type: ignore[arg-type]


def busy_pc(gov: ThreadGovernor, n: int, two_ms: float = 30.0, one_ms: float = 14.0) -> list[int]:
    """``n`` decodes on a PC where another program holds one of two cores: two threads wait (share 0.7) and are
    slower than one thread alone on the free core."""
    asked = []
    for _ in range(n):
        t = gov.running
        asked.append(gov.observe(sample(t, 0.7 if t == 2 else 1.0, ms=two_ms if t == 2 else one_ms)))
    return asked


def test_a_busy_core_starts_a_trial_of_one_thread_fewer_kept_because_it_is_faster():
    gov = governor(load=1.0)
    # A window of waiting decodes, and the OS says another program takes a core: try one thread fewer.
    asked = busy_pc(gov, WINDOW)
    assert set(asked[:-1]) == {2} and asked[-1] == 1
    assert gov.busy and gov.trying == 1 and gov.threads == 2
    assert not gov.reduced and gov.notice() == "" and not gov.steady  # a trial is not a reduction yet
    asked = busy_pc(gov, PROBE_DECODES)
    assert asked[-1] == 1 and gov.threads == 1 and gov.trying is None and gov.reductions == 1
    assert gov.reduced and gov.notice() == "Another program is busy: using 1 of 2 cores"
    assert not gov.busy and gov.steady  # one thread on the free core has it: its steps may teach its costs


def test_a_prompt_read_in_long_chunks_is_judged_after_a_few_of_them():
    gov = governor(load=1.0)
    asked = busy_pc(gov, 8, two_ms=150.0, one_ms=100.0)  # 64-token chunks deep in a long chat
    assert asked[:2] == [2, 1]  # two chunks take WINDOW_S: enough to see them wait
    assert gov.threads == 1 and gov.reductions == 1  # and three more (the first not compared) to judge the trial


def test_where_two_threads_sharing_beat_one_alone_the_trial_is_undone_and_tried_again_only_later():
    clock = Clock()
    gov = governor(load=1.0, clock=clock)
    busy_pc(gov, 2 * WINDOW + PROBE_DECODES, two_ms=20.0, one_ms=28.0)  # one thread alone is slower here
    assert gov.threads == 2 and gov.trying is None and gov.reductions == 0 and gov.trials == 1
    assert set(busy_pc(gov, 200, two_ms=20.0, one_ms=28.0)) == {2}  # not again before the wait...
    clock.now += RETRY_S
    busy_pc(gov, 2 * WINDOW + PROBE_DECODES, two_ms=20.0, one_ms=28.0)
    assert gov.trials == 2 and gov.threads == 2
    clock.now += RETRY_S  # ...which doubles after every failed trial
    busy_pc(gov, 50, two_ms=20.0, one_ms=28.0)
    assert gov.trials == 2
    clock.now += RETRY_S
    busy_pc(gov, 50, two_ms=20.0, one_ms=28.0)
    assert gov.trials == 3


def quiet_pc(rng: np.random.Generator, n: int, low: float = 0.3) -> list[DecodeSample]:
    """Decodes of a quiet 2-core PC as the OS counts them: the other thread's CPU time is credited at timer ticks,
    so a 7 ms decode's share reads ~0.8 about a third of the time and a little over 1.0 otherwise (measured so on
    a 2-core EPYC VM); now and then a late wake-up or the VM's host takes more."""
    shares = np.where(rng.random(n) < low, rng.uniform(0.76, 0.84, n), rng.uniform(1.0, 1.08, n))
    shares = np.where(rng.random(n) < 0.01, rng.uniform(0.5, 0.7, n), shares)
    return [sample(2, float(u), ms=7.0) for u in shares]


def test_an_idle_pc_never_tries_fewer_threads_and_is_never_called_busy():
    rng = np.random.default_rng(0)
    rest = RestProfile.learn(quiet_pc(rng, 400))  # what the cost measurement hears
    assert rest.floor is not None and 0.85 < rest.floor < 0.97 and rest.busy_below < rest.floor
    for load in (None, 0.02):  # the OS's counts unknown, or saying that nothing else runs
        gov = governor(load=load, rest=rest)
        asked = [gov.observe(s) for s in quiet_pc(rng, 20_000)]
        assert set(asked) == {2} and gov.trials == 0 and gov.notice() == ""
        assert gov.busy is False
    # Not learned, the fixed bar: per decode it would call a third of them busy, per window none.
    gov = governor(load=0.02)
    assert set(gov.observe(s) for s in quiet_pc(rng, 20_000)) == {2} and gov.trials == 0
    # A window that really waits (another program on a core: ~0.73) is still seen: where the OS cannot say
    # why, once the waiting has lasted a window more.
    gov = governor(rest=rest)
    asked = busy_pc(gov, 2 * WINDOW - 1)
    assert set(asked[:-1]) == {2} and asked[-1] == 1
    assert gov.busy and gov.trying == 1


def test_a_noisier_pc_at_rest_learns_a_lower_bar():
    rng = np.random.default_rng(1)
    noisy = quiet_pc(rng, 400, low=0.7)  # a VM whose host takes its vCPUs often
    rest = RestProfile.learn(noisy)
    assert rest.busy_below < RestProfile.learn(quiet_pc(rng, 400)).busy_below
    gov = governor(load=None, rest=rest)
    assert set(gov.observe(s) for s in quiet_pc(rng, 5000, low=0.7)) == {2}
    assert gov.trials == 0
    assert RestProfile.learn(noisy[: 3 * WINDOW]).floor is None  # too few decodes to learn from
    assert RestProfile().busy_below == BUSY_UTILIZATION  # not learned yet: the fixed bar
    assert RestProfile(0.2).busy_below == RestProfile.LOWEST  # never so low that a busy core goes unseen


def test_waiting_decodes_with_no_other_program_on_the_cpus_do_not_cost_a_thread():
    gov = governor(load=0.0)  # the OS: nothing else uses these CPUs
    busy_pc(gov, 100)
    assert gov.busy and gov.trials == 0 and gov.threads == 2


def test_while_reduced_one_more_thread_is_tried_when_the_os_says_a_core_is_free():
    clock = Clock()
    gov = governor(load=1.0, clock=clock)
    busy_pc(gov, 2 * WINDOW + PROBE_DECODES)
    assert gov.threads == 1
    clock.now += 10 * MAX_RETRY_S
    assert set(busy_pc(gov, 300)) == {1}  # the other program still holds its core: no trial at all
    assert gov.trials == 1
    gov.load.value = 0.0  # it ended
    asked = [gov.observe(sample(1, 1.0, ms=14)) for _ in range(WINDOW)]
    assert asked[-1] == 2 and gov.trying == 2
    assert not gov.reduced or gov.threads == 1  # the notice stays until the trial is won
    asked = [gov.observe(sample(2, 1.0, ms=9)) for _ in range(PROBE_DECODES)]
    assert asked[-1] == 2 and gov.threads == 2 and not gov.reduced


def test_when_the_os_cannot_tell_more_threads_are_tried_now_and_then_with_a_growing_wait():
    clock = Clock()
    gov = governor(load=None, clock=clock)
    busy_pc(gov, 2 * WINDOW + PROBE_DECODES)
    assert gov.threads == 1
    busy_pc(gov, WINDOW)
    assert gov.trials == 1  # too early to try again
    waits = []
    for _ in range(6):
        start = gov.trials
        waited = 0.0
        while gov.trials == start:
            clock.now += 0.5
            waited += 0.5
            busy_pc(gov, 1)
        busy_pc(gov, PROBE_DECODES)  # the trial runs and fails: the core is still taken
        assert gov.threads == 1
        waits.append(waited)
    assert waits[0] <= RETRY_S and waits == sorted(waits) and waits[-1] == pytest.approx(MAX_RETRY_S, abs=0.5)


def test_trial_speed_is_compared_per_1_token_step_of_the_threads_it_ran_with():
    """A trial that happened to run bigger batches is not taken for a slower one."""
    clock = Clock()
    gov = governor(load=None, clock=clock)
    busy_pc(gov, 2 * WINDOW + PROBE_DECODES)
    clock.now += MAX_RETRY_S
    assert gov.running == 1
    feed(gov, [sample(1, 1.0, ms=20, cost=1.0) for _ in range(WINDOW)])
    assert gov.running == 2
    feed(gov, [sample(2, 1.0, ms=30, cost=2.5) for _ in range(PROBE_DECODES)])  # 12 ms per step against 20
    assert gov.threads == 2


def test_a_governor_that_may_not_adapt_keeps_its_threads_but_still_says_when_decodes_wait():
    gov = ThreadGovernor(2, adapt=False, clock=Clock())
    assert set(feed(gov, [sample(2, 0.5) for _ in range(50)])) == {2}
    assert gov.busy and gov.trials == 0


def test_decodes_too_short_to_judge_never_count_as_contended():
    gov = governor(load=1.0)
    assert set(feed(gov, [sample(2, 0.3, ms=0.5) for _ in range(50)])) == {2}  # a tiny model's late wake-ups
    assert not gov.busy
    assert waiting_share([sample(2, 0.3, ms=0.5)] * 50) == 0.0
    assert waiting_share([sample(2, 0.3, ms=10)] * 50) == 1.0


def test_a_measurement_is_called_disturbed_by_windows_of_decodes_not_by_single_ones():
    rng = np.random.default_rng(2)
    assert waiting_share(quiet_pc(rng, 2000)) < 0.02  # a third of single decodes read ~0.8 at rest
    busy = [sample(2, 0.73) for _ in range(100)]
    assert waiting_share(quiet_pc(rng, 100) + busy) > 0.45


def test_one_thread_has_nothing_to_give_up():
    gov = governor(load=2.0, max_threads=1)
    assert set(feed(gov, [sample(1, 0.5) for _ in range(50)])) == {1}
    assert gov.notice() == "" and gov.trials == 0


def test_the_os_counts_give_other_programs_time_on_our_cpus():
    busy = [100.0, 100.0]
    own = [50.0]
    clock = Clock()
    load = CpuLoad([0, 1], read=lambda: busy, own=lambda: own[0], clock=clock)
    assert load.capacity == 2 and load.others() is None  # a first reading says nothing yet
    clock.now += 0.5  # half a second: our threads took 0.9 s of CPU, the CPUs were busy 1.4 s in all
    busy[0] += 0.5
    busy[1] += 0.9
    own[0] += 0.9
    assert load.others() == pytest.approx(1.0)
    busy[0] += 5.0
    clock.now += 0.1
    assert load.others() == pytest.approx(1.0)  # read at most every CpuLoad.MIN_SPAN_S
    clock.now += 30  # a long pause (no reply running): what it says is not about now
    assert load.others() is None
    assert CpuLoad(None).others() is None and CpuLoad(None).capacity == 0


# --- on the bundled model -------------------------------------------------------------------------------------


def starved(engine, share: float):
    """Make every decode look as if its threads had their cores ``share`` of the time (1.0: an idle PC),
    whatever else this machine is running."""
    real = engine.costs.after_decode

    def after(batch, wall, _cpu):
        real(batch, wall, wall * engine.ctx.n_threads * share)

    return after


def one_core_taken(engine):
    """Make decodes look as they do beside a program that holds one of two cores, on any machine: two threads
    wait (0.7 of their cores) and take three times as long; one thread has the free core (at least 4 ms, so
    that every decode is judged however fast this CPU is)."""
    real = engine.costs.after_decode

    def after(batch, wall, _cpu):
        if engine.ctx.n_threads == 2:
            wall = 3 * max(wall, 0.004)
            real(batch, wall, wall * 2 * 0.7)
        else:
            wall = max(wall, 0.004)
            real(batch, wall, wall)

    return after


@pytest.fixture
def governed(engine):
    """The session engine with a 2-thread governor that may adapt, restored after."""
    costs, loaded = engine.costs, engine.loaded
    saved = (costs.governor, costs.threads_agree, loaded.ctx.on_decode, loaded.n_threads, loaded.threads_chosen)
    costs.governor = ThreadGovernor(2)
    costs.threads_agree, loaded.n_threads, loaded.threads_chosen = True, 2, True
    engine.ctx.set_threads(2)
    yield engine
    costs.governor, costs.threads_agree, loaded.ctx.on_decode, loaded.n_threads, loaded.threads_chosen = saved
    engine.ctx.set_threads(engine.n_threads)


def generate(engine, prompt, lookahead, max_tokens=80):
    engine.reset()
    controls = GenerationControls(lookahead=lookahead)
    return list(engine.generate(prompt, controls, stop=StopConfig(max_tokens=max_tokens)))


@pytest.mark.model
def test_with_a_core_taken_auto_runs_on_one_thread_priced_on_its_curve_and_writes_plain_decodings_text(governed):
    engine = governed
    prompt = engine.render_chat([Message("user", "Count from one to thirty in words, one per line.")])
    engine.ctx.on_decode = starved(engine, 1.0)
    plain = generate(engine, prompt, None, max_tokens=120)
    assert {e.threads for e in plain} == {2} and not any(e.reduced or e.contended for e in plain)
    engine.ctx.on_decode = one_core_taken(engine)
    # Batches are dear on two threads and nearly free on one: what Auto does shows which curve priced it.
    with auto_on_curve(engine, replace(STEEP, one_thread=FLAT)):
        for t in (1, 2):
            engine.costs.live_costs_for(t).learn = True  # a measured curve's live costs learn
        busy_plain = generate(engine, prompt, None, max_tokens=120)
        assert busy_plain[0].threads == 2 and busy_plain[-1].threads == 1 and busy_plain[-1].reduced
        assert engine.governor.reductions == 1
        events = generate(engine, prompt, LookaheadConfig(auto=True), max_tokens=120)  # still on one thread
        assert engine.costs.live_costs_for(2).observed() == {}  # steps that waited for a core teach nothing
        assert engine.costs.live_costs_for(1).observed() != {}  # steps on the kept thread teach its own costs
    on_one = [e for e in events if e.threads == e.kept_threads == 1]
    assert len(on_one) > len(events) // 2
    # The flat curve's choices: on the steep one no draft of this reply pays. How many the flat one keeps depends on
    # what this CPU's one-thread batches really cost, which Auto's ledger of drafting steps learns as they come.
    assert sum(e.n_drafted > 0 for e in on_one) >= 3
    reference = [t for e in plain for t in e.token_ids]
    assert [t for e in busy_plain for t in e.token_ids] == reference
    assert [t for e in events for t in e.token_ids] == reference


@pytest.mark.model
def test_without_contention_auto_still_learns_its_live_costs(governed):
    engine = governed
    prompt = engine.render_chat([Message("user", "Count from one to thirty in words.")])
    with auto_on_curve(engine, FLAT):
        engine.costs.live_costs.learn = True
        engine.ctx.on_decode = starved(engine, 1.0)
        events = generate(engine, prompt, LookaheadConfig(auto=True), max_tokens=120)
        assert engine.costs.live_costs.observed() != {}
    assert engine.governor.trials == 0 and {e.threads for e in events} == {2}


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
def test_a_measurement_keeps_the_one_thread_curve_and_how_decodes_use_their_cores_at_rest(
    governed, tmp_path, monkeypatch
):
    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))
    engine = governed
    real = engine.costs.after_decode
    shares = iter(np.random.default_rng(0).uniform(0.86, 1.0, 100_000))

    def at_rest(batch, wall, _cpu):  # every decode judged (4 ms at least), its share between 0.86 and 1.0
        wall = max(wall, 0.004)
        real(batch, wall, wall * engine.ctx.n_threads * next(shares))

    engine.ctx.on_decode = at_rest
    fractions: list[float] = []
    curve, measured = curve_for(engine, refresh=True, budget_s=0.5, progress=fractions.append)
    assert measured and curve.threads == 2
    assert curve.one_thread is not None and curve.one_thread.threads == 1 and curve.one_thread.sizes[-1] == 32
    assert curve.rest_floor is not None and 0.86 <= curve.rest_floor < 0.95
    assert curve.for_threads(1) is curve.one_thread and curve.for_threads(2) is curve
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert load_cached(engine.summary.path, 2) == curve  # kept with the curve, one-thread curve and all
    engine.costs._use_curve(curve, "cached")
    assert engine.governor.rest.floor == curve.rest_floor and engine.costs.live_costs_for(1).curve is curve.one_thread
    assert engine.threads_in_use == 2


@pytest.mark.model
def test_the_probe_finds_that_one_thread_gives_the_same_logits(engine):
    from engine.costs.exactness import QUICK_PROBE_SIZES, probe_exact_batch

    engine.costs.threads_agree = None
    saved = engine.loaded.n_threads
    engine.loaded.n_threads = 2  # the check compares every thread against one
    try:
        probe_exact_batch(engine, sizes=QUICK_PROBE_SIZES[:2])
    finally:
        engine.loaded.n_threads = saved
        engine.ctx.set_threads(saved)
    assert engine.costs.threads_agree is True


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
    # Chunks end at multiples of PREFILL_CHUNK, whatever the cache held before: the first is one chunk here.
    assert steps[:-1] == [PREFILL_CHUNK] * (len(steps) - 1) and 0 < steps[-1] <= PREFILL_CHUNK
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
