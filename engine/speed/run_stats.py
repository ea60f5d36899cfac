"""What a generation measured, and how two of them compare: the one home of these definitions.

``RunStats`` folds one generation's ``StepEvent``s; ``speedup`` says how two
runs compare (a prompt's row of them is engine/speed/rows.py). The CLI,
``engine bench``, the app's reply statistics, its Compare tab and its speed
report all count and compare through these, so they agree on the same runs.
Pure Python: no model, no Qt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from engine.decoding.origins import DraftOrigin

if TYPE_CHECKING:
    from engine.decoding.generation import StepEvent

@dataclass
class RunStats:
    """What one generation did, folded from its step events in order (``observe``).

    The only place a run's counts are made. A reply's stored statistics keep
    the counts but not the tokens themselves (see ``app.stats.ReplyStats``),
    so ``n_tokens`` is counted rather than read off ``token_ids``.
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    n_tokens: int = 0
    steps: int = 0  # forward passes (the closing event of a stopped run is not one)
    per_step: list[int] = field(default_factory=list)  # tokens committed by each forward pass
    shapes: list[tuple[int, int]] = field(default_factory=list)  # each forward pass's (batch size, logit rows)
    cost: float = 0.0  # the forward passes priced on the engine's live cost curve, in 1-token steps
    decode_s: float = 0.0  # the steps' wall times: a lookahead step's planning and cache clean-up included
    elapsed_s: float = 0.0  # prompt evaluation + all steps
    first_token_s: float | None = None  # prompt evaluation + the steps up to the first token
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_steps: int = 0  # forward passes that verified a draft ...
    landed_steps: int = 0  # ... and of them, those that accepted some of it
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted draft tokens per StepEvent.draft_origin
    top2_gaps: list[float] = field(default_factory=list)  # plain decoding only, when asked for
    prompt_tokens: int = 0  # the prompt's tokens, of which prompt_cached_tokens were reused from the cache
    prompt_cached_tokens: int = 0
    prefill_tokens: int = 0  # evaluated before the first step, in prefill_s
    system_tokens: int = 0  # of the prompt, the system prompt's (chat replies)
    dropped_messages: int = 0  # the oldest messages left out to fit the context (chat replies)
    stop_reason: str | None = None
    stop_string: str = ""  # the stop string that ended the reply, if one did
    modes: list[str] = field(default_factory=list)  # distinct modes of the forward passes, in order of first use
    window: int = 0  # shape of the last lookahead step
    ngram: int = 0
    guesses: int = 0

    @classmethod
    def of(cls, events: Iterable[StepEvent]) -> RunStats:
        """The statistics of a whole run."""
        stats = cls()
        for ev in events:
            stats.observe(ev)
        return stats

    def observe(self, ev: StepEvent) -> None:
        """Fold in the next step event."""
        self.token_ids.extend(ev.token_ids)
        self.text += ev.text
        self.n_tokens += len(ev.token_ids)
        if ev.mode != "none":  # the closing event of a stopped generation is not a forward pass
            self.steps += 1
            self.per_step.append(ev.n_committed)
            self.shapes.append((ev.batch_size, ev.n_logits))
            self.cost += ev.cost
            if ev.mode not in self.modes:
                self.modes.append(ev.mode)
        if ev.mode == "lookahead":
            self.window, self.ngram, self.guesses = ev.window, ev.ngram, ev.guesses
        self.decode_s += ev.elapsed_s
        self.elapsed_s += ev.elapsed_s + ev.prefill_s
        if self.first_token_s is None and ev.token_ids:
            self.first_token_s = self.elapsed_s
        self.n_drafted += ev.n_drafted
        self.n_accepted += ev.n_accepted
        self.drafted_steps += ev.n_drafted > 0
        self.landed_steps += ev.n_drafted > 0 and ev.n_accepted > 0
        if ev.n_accepted:
            source = ev.draft_origin or DraftOrigin.UNKNOWN
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + ev.n_accepted
        self.top2_gaps.extend(ev.top2_gaps)
        if ev.prompt_tokens:
            self.prompt_tokens = ev.prompt_tokens
            self.prompt_cached_tokens = ev.prompt_cached_tokens
            self.prefill_tokens = ev.prefill_tokens
            self.system_tokens = ev.system_tokens
            self.dropped_messages = ev.dropped_messages
        if ev.stop_reason:
            self.stop_reason = ev.stop_reason
            self.stop_string = ev.stop_string

    @property
    def prefill_s(self) -> float:
        """Prompt evaluation (the same work for every decoder, so left out of ``tokens_per_s``)."""
        return max(self.elapsed_s - self.decode_s, 0.0)

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt processing speed: the tokens evaluated before the first step over their time (0.0: none)."""
        return self.prefill_tokens / self.prefill_s if self.prefill_tokens and self.prefill_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decoding speed: tokens per second of the steps' time."""
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.n_tokens / self.steps if self.steps else 0.0

    @property
    def predicted_speedup(self) -> float:
        """What the steps alone predict against plain decoding: tokens ÷ the steps' cost in 1-token steps.

        A plain run is 1.0; a run whose steps committed 2 tokens each at a cost of 1.6 steps is 1.25. It
        leaves out the machine's speed (the same for both decoders) and what the curve does not know: how
        busy the CPU was. 0.0 when the steps carry no cost (events recorded before costs were).
        """
        return self.n_tokens / self.cost if self.cost > 0 and self.n_tokens else 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens; None when nothing was drafted."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    def to_json(self) -> dict[str, Any]:
        """The run's text, counts and speeds (rounded), as ``engine generate --json`` prints them."""
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "n_tokens": self.n_tokens,
            "steps": self.steps,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "elapsed_s": round(self.elapsed_s, 4),
            "prefill_s": round(self.prefill_s, 4),
            "prompt_tokens": self.prompt_tokens,
            "prompt_cached_tokens": self.prompt_cached_tokens,
            "prompt_tokens_per_s": round(self.prompt_tokens_per_s, 1),
            "first_token_s": round(self.first_token_s or 0.0, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "accepted_by_source": self.accepted_by_source,
            "stop_reason": self.stop_reason,
        }


def speedup(plain: RunStats, other: RunStats) -> float:
    """How many times faster ``other`` decoded than ``plain``: the one meaning of "speedup" here.

        speedup = plain's decode time per token ÷ other's decode time per token
                = other.tokens_per_s ÷ plain.tokens_per_s

    Decode time is the sum of the steps' measured wall times (``RunStats.decode_s``):
    a lookahead step's planning and cache clean-up count, the prompt's evaluation
    does not (it is the same work for both). When the two replies are the same
    tokens this is plain's time ÷ other's time; when one reply ended earlier (an
    end-of-text token after a different choice at a near tie, say) it still
    compares like with like, per token. Above 1, ``other`` is faster. 0.0 when
    either run decoded no tokens or took no time: there is nothing to compare.
    """
    if plain.tokens_per_s <= 0 or other.tokens_per_s <= 0:
        return 0.0
    return other.tokens_per_s / plain.tokens_per_s


class Curve(Protocol):
    def cost(self, n: int, k: int | None = None) -> float: ...


def priced(run: RunStats, curve: Curve) -> float:
    """What ``run``'s forward passes cost on ``curve``, in 1-token steps."""
    return sum(curve.cost(n, k) for n, k in run.shapes)


def simulated_speedup(plain: RunStats, other: RunStats, curve: Curve) -> float:
    """``speedup`` with each run's time replaced by its forward passes priced on ``curve``.

        simulated speedup = plain's cost per token ÷ other's cost per token

    The tokens are the runs' own; only the time is assumed: what the same steps
    would take on the machine the curve describes (engine/costs/whatif.py). The
    planning and cache clean-up of a lookahead step are left out.
    """
    if not plain.n_tokens or not other.n_tokens:
        return 0.0
    a, b = priced(plain, curve), priced(other, curve)
    if a <= 0 or b <= 0:
        return 0.0
    return (a / plain.n_tokens) / (b / other.n_tokens)


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of the positive values (0.0 when there are none): the mean of ratios."""
    vals = [v for v in values if v > 0]
    if not vals:
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class Divergence:
    """Where two runs first differ (a token id of -1: that run had already ended)."""

    index: int
    plain_token: int
    lookahead_token: int
    plain_top2_gap: float | None  # a small gap: a near tie the plain decoder broke one way
    plain_piece: str
    lookahead_piece: str

    def as_dict(self) -> dict[str, Any]:
        """The fields above (and not a subclass's) as a plain dict, for a result row."""
        return {f.name: getattr(self, f.name) for f in fields(Divergence)}


def first_divergence(
    plain: RunStats, other: RunStats, detokenize: Callable[[Sequence[int]], str]
) -> Divergence | None:
    """Where two runs first differ, with the plain run's top-2 logit gap there (if it recorded gaps)."""
    a, b = plain.token_ids, other.token_ids
    for i in range(max(len(a), len(b))):
        ta = a[i] if i < len(a) else -1
        tb = b[i] if i < len(b) else -1
        if ta != tb:
            return Divergence(
                index=i,
                plain_token=ta,
                lookahead_token=tb,
                plain_top2_gap=plain.top2_gaps[i] if i < len(plain.top2_gaps) else None,
                plain_piece=detokenize([ta]) if ta >= 0 else "",
                lookahead_piece=detokenize([tb]) if tb >= 0 else "",
            )
    return None


# --- repeated runs: what a comparison may claim ---


def same_steps(plain: RunStats, other: RunStats) -> bool:
    """True when ``other`` ran the forward passes ``plain`` did for its tokens: as many, of as many rows.

    Two such runs did the same work, so any difference in their times is the
    machine's, not the decoder's. A run that committed a token a step but
    verified drafts that failed did more: its batches were larger.
    """
    def rows(r: RunStats) -> int:
        return sum(batch for batch, _ in r.shapes)

    return (plain.steps * other.n_tokens == other.steps * plain.n_tokens
            and rows(plain) * other.n_tokens == rows(other) * plain.n_tokens)


def predicted_gain(plain: RunStats, other: RunStats) -> float:
    """What the steps alone predict ``other`` gains over ``plain``: the ratio of their ``predicted_speedup``.

    Leaves out the machine (how busy it was, how warm): a difference that this
    does not predict came from there. 0.0 when either run's steps carry no cost.
    """
    if plain.predicted_speedup <= 0 or other.predicted_speedup <= 0:
        return 0.0
    return other.predicted_speedup / plain.predicted_speedup


@dataclass(frozen=True)
class RatioRange:
    """A ratio measured ``n`` times: its middle value and the lowest and highest measured."""

    value: float
    low: float
    high: float
    n: int

    @property
    def spread(self) -> float:
        """(high - low) relative to the value: 0.02 means the repeats agree within 2%."""
        if self.high == self.low:
            return 0.0
        return (self.high - self.low) / self.value if self.value > 0 else math.inf

    def includes(self, x: float) -> bool:
        return self.low <= x <= self.high


T = TypeVar("T")


def lower_median(xs: Sequence[T], key: Callable[[T], float]) -> T:
    """The median of ``xs`` by ``key``, the lower of the middle two for an even count: always one of ``xs``, never
    an average of two."""
    return sorted(xs, key=key)[(len(xs) - 1) // 2]


def ratio_range(ratios: Sequence[float]) -> RatioRange:
    """The median of ``ratios`` (``lower_median``: always a measured value) and their extremes."""
    if not ratios:
        return RatioRange(0.0, 0.0, 0.0, 0)
    return RatioRange(lower_median(ratios, float), min(ratios), max(ratios), len(ratios))


def median_run(runs: Sequence[RunStats]) -> RunStats:
    """The run of median decoding speed (the slower of the middle two for an even count).

    A measured run rather than averaged numbers, so the run shown and the times
    quoted are one and the same. With the lower median for both decoders, the
    speedup of the two median runs lies within the range of the pairs' speedups.
    """
    if not runs:
        raise ValueError("no runs")
    return lower_median(runs, key=lambda r: r.tokens_per_s)


# A run's times are off when its steps whose threads waited for a core took at least this share of its time: one
# late wake-up (a repaint, a timer elsewhere) in a run of hundreds of steps moves nothing a user would read.
BUSY_TIME_SHARE = 0.05


def ran_busy(events: Iterable[StepEvent]) -> bool:
    """True when another program's load shaped the run: the governor kept fewer threads than the engine may use
    during some step, or steps whose threads waited for cores took ``BUSY_TIME_SHARE`` of its time."""
    total = waited = 0.0
    for ev in events:
        if ev.reduced:
            return True
        total += ev.elapsed_s
        waited += ev.elapsed_s if ev.contended else 0.0
    return total > 0 and waited >= BUSY_TIME_SHARE * total
