"""A prompt's row, plain against lookahead, and the rows rolled up by category.

``PromptResult`` is a row of ``engine bench`` and of the app's speed report. What every row holds is its own
fields; what only some rows hold travels in typed groups: ``VerdictFigures`` (what the repeated comparison
says: ``engine.speed.comparison.prompt_result`` sets them) and ``BenchFigures`` (what ``engine bench`` adds:
draft counts, oracle bounds). ``to_json`` is the row as ``engine bench --json`` prints it, those groups
flattened into its ``extra`` object. ``by_category`` rolls rows up; the tables that show them are
engine/speed/tables.py. Pure Python: no model, no Qt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.decoding.loops import reads_as_a_loop
from engine.speed.run_stats import Divergence, RunStats, geomean, speedup
from engine.speed.workloads import Workload

ALL = "all"  # the roll-up row over every category


@dataclass(frozen=True)
class VerdictFigures:
    """What the comparison's repeats say about a row (``engine.speed.comparison.Verdict``), rounded as stored."""

    plain_first: bool  # the first pair ran plain first (the next pair turned it round)
    speedup_low: float  # the lowest and highest of the pairs' speedups, the row's ``speedup`` between them
    speedup_high: float
    pairs: int  # pairs of runs measured
    steps_predict: float  # what the steps alone predict (0.0: the steps carry no cost)
    same_steps: bool  # lookahead ran the forward passes plain did (as many, of as many rows): the machine's difference
    measurable: bool  # lookahead saved steps and every repeat says the same side of 1.0
    busy: bool  # another program held a core during some run


@dataclass(frozen=True, kw_only=True)
class BenchFigures:
    """What ``engine bench`` adds to a row: the oracle's bounds, the lookahead run's drafts, the reference rate.

    Optional figures are None where the bench had nothing to say; a row's JSON leaves them out.
    """

    measured_speedup: float | None = None  # timed, when the row's ``speedup`` is priced on a what-if curve
    oracle_bound: float  # an oracle drafting from the prompt alone (engine.tools.bench.oracle_bound)
    oracle_all_sources: float | None = None  # ... and from the earlier prompts' chats, when they were offered
    runs: int = 0  # runs timed: both decoders, every pair
    drafted: int = 0  # the lookahead median run's drafted and accepted tokens
    accepted: int = 0
    drafted_steps: int = 0  # its steps that verified a draft, and of them those that accepted some of it
    landed_steps: int = 0
    plain_tps_after_first: float = 0.0  # plain's rate after its first token (how llama-cpp-python is timed)
    documents_seen: dict[str, float] | None = None  # of each attached file, the share the prompt held
    follows_schema: bool | None = None  # plain's reply is whole JSON of the prompt's schema (None: no schema)


@dataclass
class PromptResult:
    """One prompt, plain against lookahead: a row of ``engine bench`` and of the app's speed report."""

    id: str
    cat: str
    n_tokens: int
    plain_tps: float
    lookahead_tps: float
    speedup: float
    tokens_per_step: float
    identical: bool
    first_divergence: dict[str, Any] | None
    plain_s: float = 0.0
    lookahead_s: float = 0.0
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # the lookahead run's (RunStats)
    stop_reason: str | None = None  # plain's reply's
    looped: bool = False  # plain's reply was stopped by the loop guard or reads as a loop (``reads_as_a_loop``)
    verdict: VerdictFigures | None = None  # None: one pair, not repeats (a grid's row, a row from before repeats)
    bench: BenchFigures | None = None  # engine bench's rows only

    @classmethod
    def from_runs(
        cls,
        workload: Workload,
        plain: RunStats,
        lookahead: RunStats,
        identical: bool,
        divergence: Divergence | None = None,
        verdict: VerdictFigures | None = None,
    ) -> PromptResult:
        """The row for these two runs of ``workload`` (which runs they are is the caller's choice)."""
        return cls(
            id=workload.id,
            cat=workload.cat,
            n_tokens=lookahead.n_tokens,
            plain_tps=round(plain.tokens_per_s, 2),
            lookahead_tps=round(lookahead.tokens_per_s, 2),
            speedup=round(speedup(plain, lookahead), 4),
            tokens_per_step=round(lookahead.tokens_per_step, 3),
            identical=identical,
            first_divergence=None if divergence is None else divergence.as_dict(),
            plain_s=round(plain.decode_s, 4),
            lookahead_s=round(lookahead.decode_s, 4),
            accepted_by_source=dict(sorted(lookahead.accepted_by_source.items())),
            stop_reason=plain.stop_reason,
            looped=plain.stop_reason == "loop" or reads_as_a_loop(plain.text),
            verdict=verdict,
        )

    @property
    def steps_predict(self) -> float:
        """What the steps alone predict (0.0: not recorded, or the steps carry no cost)."""
        return self.verdict.steps_predict if self.verdict is not None else 0.0

    def to_json(self) -> dict[str, Any]:
        """The row as ``engine bench --json`` prints it: its fields, then ``extra`` with the groups' figures (the
        verdict's first, then the bench's, a figure the bench had nothing for left out)."""
        extra = asdict(self.verdict) if self.verdict is not None else {}
        if self.bench is not None:
            extra.update((k, v) for k, v in asdict(self.bench).items() if v is not None)
        out = asdict(self)
        del out["verdict"], out["bench"]
        out["extra"] = extra
        return out


@dataclass(frozen=True)
class CategoryRow:
    """Prompts of one category rolled up (or of every category, ``cat == ALL``)."""

    cat: str
    n: int
    speedup: float  # geometric mean
    tokens_per_step: float  # arithmetic mean
    identical: int
    oracle_bound: float | None = None  # geometric mean of the rows' ``bench.oracle_bound``, where the bench set one
    steps_predict: float = 0.0  # geometric mean of the rows' ``steps_predict`` (0.0: none recorded)


@dataclass(frozen=True)
class Loops:
    """Rows whose plain reply looped, how many of them the loop guard stopped, and the rows that did not loop."""

    looped: int
    stopped: int
    kept: list[PromptResult]

    @classmethod
    def of(cls, results: Sequence[PromptResult]) -> Loops:
        kept = [r for r in results if not r.looped]
        return cls(looped=len(results) - len(kept), stopped=sum(r.stop_reason == "loop" for r in results), kept=kept)

    @property
    def kept_speedup(self) -> float:
        """Geometric mean over the rows that did not loop (0.0 for none)."""
        return geomean(r.speedup for r in self.kept)


def by_category(results: Sequence[PromptResult]) -> list[CategoryRow]:
    """One row per category, in order of first appearance, then ``ALL`` over every result (nothing for none)."""
    groups: dict[str, list[PromptResult]] = {}
    for r in results:
        groups.setdefault(r.cat, []).append(r)
    rows = [_roll_up(cat, rs) for cat, rs in groups.items()]
    if results:
        rows.append(_roll_up(ALL, results))
    return rows


def _roll_up(cat: str, results: Sequence[PromptResult]) -> CategoryRow:
    oracle = [r.bench.oracle_bound for r in results if r.bench is not None]
    return CategoryRow(
        cat=cat,
        n=len(results),
        speedup=geomean(r.speedup for r in results),
        tokens_per_step=sum(r.tokens_per_step for r in results) / len(results),
        identical=sum(r.identical for r in results),
        oracle_bound=geomean(oracle) if oracle else None,
        steps_predict=geomean(r.steps_predict for r in results),
    )
