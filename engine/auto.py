"""Choosing each step's shape: fixed W/N/G, or Auto from the cost curve and live acceptance.

A step that verifies a draft of L tokens costs ``cost(1 + L)`` and commits on
average ``1 + p1 + p1*p2 + ... + p1*...*pL`` tokens, where pk is the chance
that draft token k lands given the ones before it did. Auto picks the draft and
length with the best expected tokens per unit of cost, and takes a plain step
when no draft beats ``1 / cost(1)``.

pk depends on how long a stretch of the context the draft's source matched
(every accepted token makes that match one longer, so later tokens of a draft
that is landing are likelier to land) and on whether the other earlier
occurrences of the context continue the same way at that token. It is learned
per (source, match length, support) while generating, starting from priors.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field, replace

from .costmodel import CostCurve, LiveCosts
from .drafts import AGREE, ALONE, SPLIT, Draft, HistoryIndex, rank_drafts
from .plan import StepChoice
from .pool import NgramPool
from .settings import MAX_GUESSES, MAX_WINDOW, LookaheadConfig

# Longest history draft Auto verifies in one step. Drafts are not bound by N, the
# window's n-gram size: a long copy of earlier text can land 15 tokens at a time.
MAX_AUTO_DRAFT = 15


# Match lengths are pooled in these buckets (a bucket holds lengths from its edge to the next).
MATCH_EDGES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24)

# Prior acceptance of a history draft's token by the length of the context match
# behind it (which grows by one with every accepted token) and by whether the
# other earlier occurrences of that context continue the same way. Measured on
# greedy replies of a 135M instruct model to 60 mixed prompts, then shaded down
# a little. Worth PRIOR_WEIGHT tokens; what lands while generating moves them.
_HISTORY_PRIORS = {
    support: dict(zip(MATCH_EDGES, priors, strict=True))
    for support, priors in (
        (ALONE, (0.35, 0.52, 0.6, 0.72, 0.75, 0.78, 0.8, 0.86, 0.89, 0.95, 0.96)),
        (AGREE, (0.6, 0.78, 0.83, 0.88, 0.9, 0.9, 0.93, 0.95, 0.95, 0.98, 0.99)),
        (SPLIT, (0.15, 0.2, 0.25, 0.45, 0.5, 0.4, 0.5, 0.5, 0.6, 0.6, 0.8)),
    )
}
POOL_PRIOR = 0.2
PRIOR_WEIGHT = 6.0
# Each observed draft fades what was seen before it a little, so the estimates
# follow the kind of text being written now (a list, a copy, free prose).
DECAY = 0.95
MAX_P = 0.995

Bucket = tuple[str, int, int]  # (source, match edge, support)


def match_bucket(m: int) -> int:
    return MATCH_EDGES[max(bisect_right(MATCH_EDGES, m) - 1, 0)]


def bucket(d: Draft, k: int = 0) -> Bucket:
    """The statistics bucket of draft token ``k`` (its match is the draft's plus the k tokens before it)."""
    return (d.source, match_bucket(d.match + k), d.support_at(k))


def _prior(b: Bucket) -> float:
    source, edge, support = b
    if source == "history":
        return _HISTORY_PRIORS[support][edge]
    return POOL_PRIOR


@dataclass
class AcceptanceStats:
    """Acceptance of draft tokens, by source, match length and support (each token given the ones before it landed)."""

    accepted: dict[Bucket, float] = field(default_factory=dict)
    tested: dict[Bucket, float] = field(default_factory=dict)

    def p(self, b: Bucket) -> float:
        """Estimated acceptance (prior blended with what was seen)."""
        a = self.accepted.get(b, 0.0) + _prior(b) * PRIOR_WEIGHT
        t = self.tested.get(b, 0.0) + PRIOR_WEIGHT
        return min(a / t, MAX_P)

    def expected(self, d: Draft) -> list[float]:
        """Expected tokens a step commits when it verifies the first L tokens of ``d``, for L = 0..len(d)."""
        out = [1.0]
        run = 1.0
        for k in range(len(d.tokens)):
            run *= self.p(bucket(d, k))
            out.append(out[-1] + run)
        return out

    def observe(self, d: Draft, n_drafted: int, n_accepted: int) -> None:
        """A draft of ``n_drafted`` tokens had its first ``n_accepted`` accepted."""
        for b in self.tested:
            self.tested[b] *= DECAY
            self.accepted[b] *= DECAY
        # Tokens tested: the accepted ones plus the first rejected one, if any.
        for k in range(min(n_accepted + 1, n_drafted)):
            b = bucket(d, k)
            self.tested[b] = self.tested.get(b, 0.0) + 1.0
            self.accepted[b] = self.accepted.get(b, 0.0) + (1.0 if k < n_accepted else 0.0)


def expected_tokens(p: float, length: int) -> float:
    """1 + p + ... + p^length: expected tokens of a step whose draft tokens each land with probability p."""
    return sum(p**i for i in range(length + 1))


def break_even_p(curve: CostCurve | LiveCosts, length: int) -> float:
    """The per-token acceptance above which a draft of ``length`` tokens beats a plain step (1.0: never)."""
    need = curve.cost(1 + length) / curve.cost(1)
    if expected_tokens(MAX_P, length) <= need:
        return 1.0
    lo, hi = 0.0, MAX_P
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, length) <= need else (lo, mid)
    return hi


class FixedPolicy:
    """The user's W, N, G as given: G ranked drafts of N-1 tokens and a W-column window."""

    def __init__(self, history: HistoryIndex, pool: NgramPool) -> None:
        self.history = history
        self.pool = pool

    def choose(self, token: int, cfg: LookaheadConfig, room: int) -> StepChoice:
        n_draft = cfg.ngram - 1
        drafts = rank_drafts(self.history, self.pool, token, min(cfg.guesses, MAX_GUESSES), n_draft)
        W = cfg.window
        while W > 0 and (W - 1) + W * (cfg.ngram - 2) + sum(len(d.tokens) for d in drafts) > room:
            W -= 1
        while drafts and sum(len(d.tokens) for d in drafts) > room:
            drafts.pop()
        return StepChoice(drafts=tuple(drafts), window=W, ngram=cfg.ngram if W else 0, reason="fixed")


class AutoPolicy:
    """Sizes every step from the cost curve and the acceptance seen so far.

    ``cfg`` bounds its window (W and N are maxima); G=0 turns drafting off.
    History drafts are sized here, up to MAX_AUTO_DRAFT tokens.
    """

    def __init__(
        self, history: HistoryIndex, pool: NgramPool, curve: CostCurve | LiveCosts, stats: AcceptanceStats
    ) -> None:
        self.history = history
        self.pool = pool
        self.curve = curve
        self.stats = stats
        # Window: Jacobi guesses rarely land for small models; a window is only
        # worth running where the curve makes its extra tokens nearly free.
        self.window_gain = 0.15
        # The least per-token acceptance that makes any draft length pay: drafts
        # from sources below it are not even looked up (they cost a lookup per step).
        self.min_p = min(break_even_p(curve, L) for L in range(1, MAX_AUTO_DRAFT + 1))

    def choose(self, token: int, cfg: LookaheadConfig, room: int) -> StepChoice:
        curve = self.curve
        max_len = min(MAX_AUTO_DRAFT, room)
        plain_rate = 1.0 / curve.cost(1)
        best = StepChoice(reason="plain: no draft worth its cost", expected_gain=1.0)
        best_rate = plain_rate
        drafts: list[Draft] = []
        if cfg.guesses:
            drafts = self.history.propose(token, max_len, 1)
            if not drafts and self.stats.p(("pool", 1, ALONE)) >= self.min_p:
                drafts = rank_drafts(self.history, self.pool, token, 1, max_len)
        for d in drafts:
            expected = self.stats.expected(d)
            for L in range(1, len(d.tokens) + 1):
                rate = expected[L] / curve.cost(1 + L)
                if rate > best_rate:
                    best_rate = rate
                    best = StepChoice(
                        drafts=(replace(d, tokens=d.tokens[:L], support=d.support[:L]),),
                        reason=f"{d.source} match {d.match}, L={L}, expect {expected[L]:.2f} tokens",
                        expected_gain=rate / plain_rate,
                    )
        # A window pays only when its tokens cost less than what it is expected to add.
        if cfg.window > 0:
            n = 1 + sum(len(d.tokens) for d in best.drafts)
            W = min(cfg.window, MAX_WINDOW)
            N = max(3, min(cfg.ngram, 4))
            extra = (W - 1) + W * (N - 2)
            if extra <= room - n + 1:
                with_window = (best_rate * curve.cost(n) + self.window_gain) / curve.cost(n + extra, n + W)
                if with_window > best_rate:
                    best = StepChoice(
                        drafts=best.drafts,
                        window=W,
                        ngram=N,
                        reason=best.reason + f" + window {W}x{N - 1}",
                        expected_gain=with_window / plain_rate,
                    )
        return best

    def observe(self, choice: StepChoice, n_accepted: int) -> None:
        if choice.drafts:
            d = choice.drafts[0]
            self.stats.observe(d, len(d.tokens), min(n_accepted, len(d.tokens)))
