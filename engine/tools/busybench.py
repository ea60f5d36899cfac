"""Speed with another program busy on one core, against the same PC at rest, in one run.

``engine bench --busy`` runs the same prompts idle and beside a busy loop that
it starts, pins to the last CPU this process may use and stops again by its
PID: plain decoding and Auto, each with the thread governor (contention.py),
with every thread fixed (as before the governor), and with one thread fixed
(what one thread alone achieves: the bar the governor must reach when a core is
taken). Conditions are interleaved round by round (idle and busy, and the
policies in turn first) so that drift in the machine's speed reaches all of
them, after one untimed Auto pass over the prompts (Auto's first replies learn
how often drafts land). Each condition's rate in a round is its tokens over its
seconds; two conditions compare as any two are compared here
(``engine.speed.comparison.paired_ratio``): rounds are the pairs, the ratio is
that of the median rounds and the range spans the rounds' ratios. The ratios
busy / idle are what the user feels when another program takes a core; the
governor's thread counts step by step show what it did.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.decoding.runtime import Engine, GenerationControls
from engine.decoding.settings import LookaheadConfig, StopConfig
from engine.decoding.text import Message
from engine.speed.comparison import paired_ratio
from engine.speed.run_stats import RatioRange

MODES = ("plain", "auto")
POLICIES = ("governor", "fixed", "one")  # adapting threads; every thread kept; one thread kept


class BusyLoop:
    """A process that spins on one CPU (the last one this process may use) until the block ends."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu: int | None = None

    def __enter__(self) -> BusyLoop:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        if hasattr(os, "sched_setaffinity"):
            self.cpu = max(os.sched_getaffinity(0))
            os.sched_setaffinity(self.proc.pid, {self.cpu})
        time.sleep(0.2)  # let it start spinning
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@dataclass
class Cell:
    """The tokens and seconds of one (load, mode, policy) over all rounds."""

    tokens: int = 0
    seconds: float = 0.0  # from the first step's end to the last step's (the prompt read not included)
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    steps: int = 0
    threads_seen: set[int] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    # Per reply, the thread count of every step, run-length coded: [(threads, steps), ...].
    timelines: list[list[tuple[int, int]]] = field(default_factory=list)
    busy_steps: int = 0  # steps judged to have waited for cores (StepEvent.contended)
    round_rates: list[float] = field(default_factory=list)  # tokens per second in each round, in round order

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0


@dataclass
class BusyReport:
    cells: dict[tuple[str, str, str], Cell]  # (load "idle" | "busy", mode, policy)
    threads: int
    rounds: int
    busy_cpu: int | None
    governor_on: bool  # False: this model or setting keeps its thread count, "governor" runs equal "fixed"

    def ratio(self, mode: str, policy: str, num: str = "busy", den: str = "idle", den_policy: str = "") -> RatioRange:
        """One condition's rate against another's, round by round (``paired_ratio``)."""
        a = self.cells[(num, mode, policy)].round_rates
        b = self.cells[(den, mode, den_policy or policy)].round_rates
        return paired_ratio(a, b) if a and len(a) == len(b) else RatioRange(0.0, 0.0, 0.0, 0)

    def ratios(self) -> dict[str, RatioRange]:
        """The figures the governor is judged by, per mode (each from the same rounds of this run)."""
        out: dict[str, RatioRange] = {}
        for mode in MODES:
            out |= {
                f"{mode}_busy_vs_idle_governor": self.ratio(mode, "governor", "busy", "idle", "fixed"),
                f"{mode}_busy_vs_idle_fixed": self.ratio(mode, "fixed", "busy", "idle", "fixed"),
                f"{mode}_busy_governor_vs_one_thread": self.ratio(mode, "governor", "busy", "busy", "one"),
                f"{mode}_one_thread_vs_idle": self.ratio(mode, "one", "idle", "idle", "fixed"),
                f"{mode}_idle_governor_vs_fixed": self.ratio(mode, "governor", "idle", "idle", "fixed"),
            }
        return out

    def identical(self) -> bool:
        """Whether every run of every cell wrote the text plain decoding wrote for that prompt."""
        reference = self.cells[("idle", "plain", "fixed")].texts
        return all(c.texts == reference for c in self.cells.values())

    def to_json(self) -> dict:
        ratios = self.ratios()
        return {
            "threads": self.threads,
            "rounds": self.rounds,
            "busy_cpu": self.busy_cpu,
            "governor_on": self.governor_on,
            "identical": self.identical(),
            "cells": [
                {"load": load, "mode": mode, "policy": policy, "tokens": c.tokens, "seconds": round(c.seconds, 3),
                 "tokens_per_s": round(c.tokens_per_s, 2), "prompt_tokens_per_s": round(c.prompt_tokens_per_s, 1),
                 "tokens_per_step": round(c.tokens / c.steps, 3) if c.steps else 0.0,
                 "threads_seen": sorted(c.threads_seen), "busy_steps": c.busy_steps,
                 "timelines": c.timelines}
                for (load, mode, policy), c in self.cells.items()
            ],
            "ratios": {k: round(r.value, 3) for k, r in ratios.items()},
            "ratio_ranges": {k: [round(r.low, 3), round(r.high, 3), r.n] for k, r in ratios.items()},
        }

    def table(self) -> str:
        head = f"{'load':<5} {'mode':<6} {'threads':<9} {'tok/s':>7} {'prompt tok/s':>12} {'tok/step':>8}"
        rows = [f"{head} {'busy steps':>10}  threads used"]
        for (load, mode, policy), c in self.cells.items():
            per_step = c.tokens / c.steps if c.steps else 0.0
            used = ",".join(str(t) for t in sorted(c.threads_seen))
            rows.append(f"{load:<5} {mode:<6} {policy:<9} {c.tokens_per_s:>7.1f} {c.prompt_tokens_per_s:>12.1f} "
                        f"{per_step:>8.2f} {c.busy_steps:>10}  {used}")
        rows += ["", "the governor's threads, reply by reply (threads x steps, in step order):"]
        for (load, mode, policy), c in self.cells.items():
            if policy == "governor":
                replies = " | ".join(" ".join(f"{t}x{n}" for t, n in line) for line in c.timelines)
                rows.append(f"{load:<5} {mode:<6} {replies}")
        r = self.ratios()

        def said(key: str, digits: int = 2) -> str:
            x = r[f"{mode}_{key}"]
            return f"{x.value:.{digits}f}x ({x.low:.{digits}f}-{x.high:.{digits}f})"

        rows.append("")
        for mode in MODES:
            rows.append(
                f"{mode}: busy/idle {said('busy_vs_idle_governor')} with the governor, "
                f"{said('busy_vs_idle_fixed')} with {self.threads} fixed threads; "
                f"busy governor/one thread {said('busy_governor_vs_one_thread')}; "
                f"one thread idle/idle {said('one_thread_vs_idle')}; "
                f"idle governor/fixed {said('idle_governor_vs_fixed', 3)}")
        rows.append(f"(each: the median rounds' ratio, and the lowest and highest of the {self.rounds} rounds' ratios)")
        if not self.governor_on:
            rows.append("the thread governor is off for this model or thread setting: it runs as 'fixed'")
        rows.append(f"text identical in every run: {self.identical()}")
        return "\n".join(rows)


def run_busy_bench(
    engine: Engine,
    prompts: Sequence[str],
    max_tokens: int = 128,
    rounds: int = 2,
    on_cell: Callable[[str, str, str, Cell], None] | None = None,
    busy_loop: Callable[[], BusyLoop] = BusyLoop,
) -> BusyReport:
    """Every prompt in plain and Auto, with and without the thread governor, idle and beside a busy loop."""
    chats = [engine.render_chat([Message("user", p)]) for p in prompts]
    cells = {(load, mode, policy): Cell() for load in ("idle", "busy") for mode in MODES for policy in POLICIES}
    adapt = engine.governor.adapt
    engine.keep_replies = False
    busy_cpu = None
    try:
        # Not timed: Auto's first replies learn how often drafts land; that would fall on whichever cell ran first.
        for chat in chats:
            _generate(engine, chat, LookaheadConfig(auto=True), max_tokens, Cell())
        for r in range(rounds):
            # Each round starts with another policy, so that no policy always follows the same one.
            policies = POLICIES[r % len(POLICIES) :] + POLICIES[: r % len(POLICIES)]
            for load in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
                if load == "busy":
                    with busy_loop() as loop:
                        busy_cpu = loop.cpu
                        _round(engine, chats, max_tokens, load, policies, cells, adapt, on_cell)
                else:
                    _round(engine, chats, max_tokens, load, policies, cells, adapt, on_cell)
    finally:
        engine.governor.adapt = adapt
        engine.governor.reset()
        engine.ctx.set_threads(engine.n_threads)
    return BusyReport(cells=cells, threads=engine.n_threads, rounds=rounds, busy_cpu=busy_cpu, governor_on=adapt)


def _round(
    engine: Engine,
    chats: Sequence[list[int]],
    max_tokens: int,
    load: str,
    policies: Sequence[str],
    cells: dict[tuple[str, str, str], Cell],
    adapt: bool,
    on_cell: Callable[[str, str, str, Cell], None] | None,
) -> None:
    for mode in MODES:
        for policy in policies:
            cell = cells[(load, mode, policy)]
            engine.governor.adapt = adapt and policy == "governor"
            threads = 1 if policy == "one" else engine.n_threads
            lookahead = LookaheadConfig(auto=True) if mode == "auto" else None
            # Not timed: a few steps on this cell's threads first (a core left idle by the cell before may wake
            # slowly). Then the condition starts afresh, as a reply does after a quiet while.
            _start_cell(engine, threads)
            _generate(engine, chats[0], lookahead, 16, Cell())
            _start_cell(engine, threads)
            tokens, seconds = cell.tokens, cell.seconds
            for chat in chats:
                _generate(engine, chat, lookahead, max_tokens, cell)
            spent = cell.seconds - seconds
            cell.round_rates.append((cell.tokens - tokens) / spent if spent > 0 else 0.0)
            if on_cell is not None:
                on_cell(load, mode, policy, cell)


def _start_cell(engine: Engine, threads: int) -> None:
    """The governor from its start (every thread it may use), and ``threads`` set for the next decode."""
    engine.governor.reset()
    engine.ctx.set_threads(threads)


def _generate(
    engine: Engine, prompt: list[int], lookahead: LookaheadConfig | None, max_tokens: int, cell: Cell
) -> None:
    engine.reset()
    first_end = last_end = 0.0
    parts: list[str] = []
    timeline: list[tuple[int, int]] = []
    for ev in engine.generate(prompt, GenerationControls(lookahead=lookahead), stop=StopConfig(max_tokens=max_tokens)):
        last_end = time.perf_counter()
        parts.append(ev.text)
        if ev.threads:
            cell.threads_seen.add(ev.threads)
            if timeline and timeline[-1][0] == ev.threads:
                timeline[-1] = (ev.threads, timeline[-1][1] + 1)
            else:
                timeline.append((ev.threads, 1))
        cell.busy_steps += ev.contended
        if ev.step == 0:
            first_end = last_end
            cell.prompt_tokens += ev.prefill_tokens
            cell.prompt_seconds += ev.prefill_s
        elif ev.n_committed:
            cell.tokens += ev.n_committed
            cell.steps += 1
    cell.seconds += last_end - first_end
    cell.texts.append("".join(parts))
    cell.timelines.append(timeline)
