"""A short soak: plain, fixed lookahead and Auto in turn, W/N/G changing, the cache checked after every step.

The long run is ``python -m engine.tools.soak --generations 200`` (not part of the test run).
"""

from __future__ import annotations

import pytest

from engine import StopConfig
from engine.tools.soak import MAX_RSS_GROWTH_PCT, cache_error, run_soak

pytestmark = [pytest.mark.model, pytest.mark.auto]


def test_a_short_soak_keeps_the_cache_exact_and_memory_flat(engine):
    report = run_soak(engine, generations=12, max_tokens=24, warmup=3)
    engine.reset()
    assert report.generations == 12 and report.steps > 12 * 3
    assert report.by_mode == {"plain": 4, "lookahead": 4, "auto": 4}
    assert report.shapes_seen >= 4  # W/N/G really changed
    assert report.cancelled >= 1  # a stop mid-generation is part of the cycle
    assert report.cache_errors == []
    assert report.rss_growth_pct < MAX_RSS_GROWTH_PCT, report.line()
    print(report.line())


def test_the_cache_check_notices_a_speculative_entry_left_behind(engine):
    engine.reset()
    events = list(engine.generate(engine.tokenize("Hello there"), stop=StopConfig(max_tokens=3)))
    assert events and cache_error(engine) is None
    # One sequence losing its entries, as a faulty clean-up could leave it, is caught.
    engine.ctx.seq_rm(5, 0, -1)
    assert "seq 5" in (cache_error(engine) or "")
    engine.reset()
