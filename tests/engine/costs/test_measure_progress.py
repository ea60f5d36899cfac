"""Measuring this PC reports its progress in small steps, so that the status bar's bar moves from the start."""

from __future__ import annotations

import pytest

from engine.costs import calibration
from engine.costs.calibration import measure

pytestmark = pytest.mark.model

SIZES = (1, 2, 4, 8, 16, 24)
PAIRS_IN_FIRST_ROUND = 2 * (len(SIZES) - 1)  # every size but 1, with one logit and with all


@pytest.fixture(scope="module")
def own_engine(model_path):
    """An engine of this module's own: measuring changes what an engine knows of its threads."""
    from engine import Engine

    eng = Engine(model_path, n_ctx=1024, n_threads=1)
    yield eng
    eng.close()


def test_progress_never_goes_back_ends_at_one_and_moves_at_every_pair_of_the_first_round(own_engine, monkeypatch):
    monkeypatch.setattr(calibration, "BUSY_SHARE", float("inf"))  # other programs on this PC must not stop it here
    seen: list[float] = []
    measure(own_engine, budget_s=0.5, sizes=SIZES, progress=seen.append)

    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(b >= a for a, b in zip(seen, seen[1:], strict=False))
    probe = [f for f in seen if f <= 0.1]
    assert len(set(probe)) >= 10  # the exact-batch probe moves the bar too, not only its last steps
    # The timing part: after the probe's last report (its share, 0.1). Each pair of the first round moves the bar,
    # whether the clock or the work done leads: it no longer waits for a whole round to pass.
    last_probe = max(i for i, f in enumerate(seen) if f <= 0.1)
    first_round = seen[last_probe + 1 : last_probe + PAIRS_IN_FIRST_ROUND]
    assert len(first_round) == PAIRS_IN_FIRST_ROUND - 1
    assert all(b > a > 0.1 for a, b in zip(first_round, first_round[1:], strict=False)), first_round


@pytest.mark.parametrize("where", ["probe's prefill", "threads check", "timed pair"])
def test_a_cancel_stops_the_measurement_before_its_next_decode_wherever_it_is(own_engine, monkeypatch, request, where):
    """A reply asked for while this PC is measured waits for one decode at most: not for the rest of a prompt
    piece, of the one-thread check or of a timed pair."""
    import threading

    monkeypatch.setattr(calibration, "BUSY_SHARE", float("inf"))
    monkeypatch.setattr(own_engine.loaded, "n_threads", 2)  # so that the one-thread check runs
    monkeypatch.setattr(own_engine.costs, "threads_agree", None)
    request.addfinalizer(lambda: own_engine.ctx.set_threads(1))  # after monkeypatch has put n_threads back
    cancel = threading.Event()
    timing = threading.Event()  # set once the probe is over: the cache is filled, then the pairs are timed
    decodes: list[int] = []
    after_cancel: list[int] = []
    real_decode = own_engine.ctx.decode

    def cancel_here(batch) -> bool:
        if where == "probe's prefill":
            return len(decodes) == 1  # the first of a 50-token piece's chunks
        if where == "threads check":
            return own_engine.ctx.n_threads == 1
        # a pair's batch: after the three warm-up steps and the pair's first step
        return timing.is_set() and batch.n_tokens > 1 and decodes.count(1) >= 4

    def decode(batch) -> None:
        if cancel.is_set():
            after_cancel.append(batch.n_tokens)
        real_decode(batch)
        if where != "timed pair" or timing.is_set():
            decodes.append(batch.n_tokens)
        if not cancel.is_set() and cancel_here(batch):
            cancel.set()

    monkeypatch.setattr(own_engine.ctx, "decode", decode)
    with pytest.raises(calibration.MeasurementCancelled):
        measure(own_engine, budget_s=0.5, sizes=SIZES, cancel=cancel,
                progress=lambda f: timing.set() if f >= 0.1 else None)
    assert cancel.is_set() and after_cancel == [], after_cancel
    assert own_engine.kv.n == 0  # nothing measured is left in the cache
