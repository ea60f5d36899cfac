"""Auto on a pinned cost curve: what it chooses, and whether it drafts, are then the same on every CPU.

Tests of Auto's choices plan on a named curve with no live correction; tests of
exactness run Auto on the flat curve, where it drafts whenever it has a draft,
so that the text they compare went through verified drafts on any machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine import Engine
from engine.costs import calibration
from engine.costs.curve import REFERENCE_CURVES, CostCurve
from engine.costs.whatif import load_curve
from engine.decoding.acceptance import AcceptanceStats

FLAT = REFERENCE_CURVES["flat"]
STEEP = REFERENCE_CURVES["steep"]
# What-if curves of 8-core laptops (engine/costs/whatif.py's roofline, not measurements): examples of flat curves.
LAPTOP_CURVES = Path(__file__).resolve().parents[1] / "data" / "curves"


def laptop_curve(name: str) -> CostCurve:
    return load_curve(LAPTOP_CURVES / f"{name}.json")


@contextmanager
def auto_on_curve(engine: Engine, curve: CostCurve) -> Iterator[Engine]:
    """Auto plans on ``curve`` (steps still capped at this model's exact batches), learning acceptance afresh;
    the engine's own curve and statistics come back afterwards."""
    saved = engine.acceptance
    engine.acceptance = AcceptanceStats()
    engine.plan_with(curve)
    try:
        yield engine
    finally:
        engine.plan_with(None)
        engine.acceptance = saved


def tune_here(engine: Engine) -> CostCurve:
    """This PC's curve for ``engine``, measured even while another program runs (a busy CI machine): what a
    measurement under load does is test_contention's, not the concern of tests that only need a curve."""
    saved = calibration.BUSY_SHARE
    calibration.BUSY_SHARE = float("inf")
    try:
        return engine.tune()
    finally:
        calibration.BUSY_SHARE = saved
