"""``engine bench --busy``: its busy loop, and one tiny run of the benchmark on the bundled model."""

from __future__ import annotations

import os
import time

import pytest

from engine.tools.busybench import MODES, POLICIES, BusyLoop, run_busy_bench


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="pinning needs sched_setaffinity (Linux)")
@pytest.mark.timing
def test_the_busy_loop_spins_on_the_last_cpu_of_ours_and_is_gone_after_the_block():
    with BusyLoop() as loop:
        assert loop.proc is not None
        pid = loop.proc.pid
        assert loop.cpu == max(os.sched_getaffinity(0))
        assert os.sched_getaffinity(pid) == {loop.cpu}
        # It really spins: a tenth of a CPU second comes within 0.3 s on a quiet core; waited for (up to 10 s)
        # rather than slept for, since another program on that core may take half of it.
        before = _cpu_seconds(pid)
        deadline = time.monotonic() + 10
        while _cpu_seconds(pid) - before <= 0.1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cpu_seconds(pid) - before > 0.1
    assert loop.proc is None
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped, not left as a zombie


@pytest.mark.model
def test_a_tiny_busy_bench_fills_every_cell_and_checks_the_text(engine):
    loops: list[BusyLoop] = []

    def counted() -> BusyLoop:
        loops.append(BusyLoop())
        return loops[-1]

    cells_done: list[tuple[str, str, str]] = []
    report = run_busy_bench(engine, ["Name three colours."], max_tokens=8, rounds=2, busy_loop=counted,
                            on_cell=lambda load, mode, policy, _cell: cells_done.append((load, mode, policy)))
    assert len(loops) == 2 and all(loop.proc is None for loop in loops)  # one busy loop per round, all stopped
    assert sorted(report.cells) == sorted((load, m, p) for load in ("idle", "busy") for m in MODES for p in POLICIES)
    assert len(cells_done) == 2 * len(report.cells)
    for (_load, _mode, policy), cell in report.cells.items():
        assert cell.tokens > 0 and cell.seconds > 0 and len(cell.texts) == 2
        assert cell.threads_seen and max(cell.threads_seen) <= engine.n_threads
        assert len(cell.timelines) == 2  # a reply's steps, its first one included:
        assert sum(n for line in cell.timelines for _t, n in line) == cell.steps + 2
        if policy == "one":
            assert cell.threads_seen == {1}  # the one-thread reference really ran on one thread
        elif policy == "fixed":
            assert cell.threads_seen == {engine.n_threads}
    assert report.identical()
    report.cells[("busy", "auto", "fixed")].texts[0] += "!"
    assert not report.identical()  # the check can fail
    summary = report.to_json()
    assert set(summary["ratios"]) >= {"plain_busy_vs_idle_governor", "auto_busy_vs_idle_fixed",
                                      "plain_busy_governor_vs_one_thread", "auto_one_thread_vs_idle"}
    governor, one = report.cells[("busy", "plain", "governor")], report.cells[("busy", "plain", "one")]
    assert len(governor.round_rates) == len(one.round_rates) == 2  # a rate per round: the rounds are the pairs
    per_round = [g / o for g, o in zip(governor.round_rates, one.round_rates, strict=True)]
    value = min(governor.round_rates) / min(one.round_rates)  # the median rounds' ratio (the lower of two)
    assert summary["ratios"]["plain_busy_governor_vs_one_thread"] == round(value, 3)
    low, high, n = summary["ratio_ranges"]["plain_busy_governor_vs_one_thread"]
    assert (low, high, n) == (round(min(*per_round, value), 3), round(max(*per_round, value), 3), 2)
    table = report.table()
    assert "busy/idle" in table and "the governor's threads, reply by reply" in table
    assert f"busy  plain  {engine.n_threads}x" in table or "busy  plain  1x" in table
    assert engine.threads_in_use == engine.n_threads  # every thread again after the bench
