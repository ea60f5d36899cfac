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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine.costs.curve import CostCurve, LiveCosts
from engine.decoding.decoders import NO_CONFIDENCE
from engine.decoding.drafts import AGREE, ALONE, FORCED, SPLIT, Draft, DraftSources
from engine.decoding.origins import DraftOrigin, DraftSource
from engine.decoding.plan import StepChoice
from engine.decoding.settings import MAX_GUESSES, MAX_WINDOW, LookaheadConfig

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
# A short match in an earlier chat is mostly a coincidence: the same few tokens in another conversation say
# little about this one. Measured on the bundled model over the 30 repo workloads in bench order, a 2-token
# match there landed its first token 15% of the time alone and 35% where earlier occurrences agreed (a prompt's
# or reply's: 54% and 64%). Longer matches take the history priors.
_CORPUS_SHORT_PRIORS = {
    ALONE: {1: 0.1, 2: 0.15, 3: 0.2},
    AGREE: {1: 0.25, 2: 0.35, 3: 0.5},
    SPLIT: {1: 0.1, 2: 0.1, 3: 0.15},
}
POOL_PRIOR = 0.2
# Text a grammar forces lands unless the model splits it into other tokens than the grammar's own.
GRAMMAR_PRIOR = 0.95
# An n-gram kept from earlier replies lands less often than one of this reply's pool: replaying plain decoding's
# replies to the 30 repo workloads in bench order, the first token of the kept pool's drafts Auto is offered
# landed 9% of the time after a token the model was not sure of and 14% after one it was (this reply's pool: 19%
# and 33%; on 14 other prompts, kept 8% and 6%). Its own prior keeps kept drafts from being verified as
# alternatives where a token more costs a fifth of a step; where it costs little, they still are.
KEPT_PRIORS = {False: 0.08, True: 0.12}
# The step that reads the prompt's last token (the chat template's own, a line break) finds n-grams of what
# followed that token elsewhere in the prompt, which is seldom how a reply starts: of such drafts, none of 36 in
# 18 replies of the bundled model landed, and 2 of 28 of Gemma 3 270M's.
OPENING_PRIOR = 0.05
PRIOR_WEIGHT = 6.0
# A window column's yield: draft tokens that land later from its trajectory. Measured on the bundled
# model with W=2 and W=4, N=4, G=2 on the repo workloads: 0.036-0.044 tokens per column and step.
WINDOW_PRIOR = 0.04
WINDOW_PRIOR_COLUMNS = 40.0
WINDOW_DECAY = 0.995
# Each observed draft fades what was seen before it a little, so the estimates
# follow the kind of text being written now (a list, a copy, free prose).
DECAY = 0.95
# A draft Auto passes over fades what was seen of its first token's bucket much more slowly, back towards the
# prior: a source whose drafts failed a few times in a row is tried again after a while (a session keeps its
# statistics, so without this it would never be), at the price of a failed draft every few hundred steps
# where its drafts really never land.
PASS_DECAY = 0.998
MAX_P = 0.995
# Whether a reply's recent drafts of short matches paid (AutoPolicy.trust): the tokens its recent steps that verified
# such a draft committed over what those steps cost in 1-token steps, measured (their wall time over a 1-token
# step's), each older step counting LEDGER_DECAY as much as the one after it. A match shorter than SHORT_MATCH tokens
# may be a coincidence (in free writing it mostly is); a longer one is text being copied, which its own statistics
# price. Below 1, those steps gave fewer tokens per second than plain decoding would have, and the expected extra
# tokens of every short-match draft are scaled by that rate to the power TRUST_POWER: a reply whose coincidental
# drafts fail stops paying for them within a few steps, without waiting for every (source, match, support) bucket
# to learn it, while a copy that starts later in the reply is drafted at once. Steps without such drafts move the
# rate back towards 1 by LEDGER_RETURN, so they are tried again later in the reply.
SHORT_MATCH = 4
LEDGER_DECAY = 0.8
LEDGER_RETURN = 0.005
TRUST_POWER = 3.0

# (source, match edge, support, sure): ``sure`` says the model was sure of the token the draft follows
# (decoders.is_sure), as where text is copied or written by rote; drafts land more often there than in free writing.
Bucket = tuple[str, int, int, bool]
_POOL_UNSURE: Bucket = (DraftSource.POOL, 1, ALONE, False)
_POOL_SURE: Bucket = (DraftSource.POOL, 1, ALONE, True)
_KEPT_UNSURE: Bucket = (DraftSource.KEPT, 1, ALONE, False)
_KEPT_SURE: Bucket = (DraftSource.KEPT, 1, ALONE, True)
_OPENING: Bucket = (DraftSource.OPENING, 1, ALONE, False)  # the token before is the prompt's: never sure


def match_bucket(m: int) -> int:
    return MATCH_EDGES[max(bisect_right(MATCH_EDGES, m) - 1, 0)]


def bucket(d: Draft, k: int = 0, sure: bool = False) -> Bucket:
    """The statistics bucket of draft token ``k`` (its match is the draft's plus the k tokens before it)."""
    return (d.source, match_bucket(d.match + k), d.support_at(k), sure)


def _prior(b: Bucket) -> float:
    source, edge, support, sure = b
    if support == FORCED:
        return GRAMMAR_PRIOR
    if source == DraftSource.CORPUS and edge in _CORPUS_SHORT_PRIORS[support]:
        return _CORPUS_SHORT_PRIORS[support][edge]
    if source in (DraftSource.HISTORY, DraftSource.DOCUMENT, DraftSource.CORPUS):
        return _HISTORY_PRIORS[support][edge]
    if source == DraftSource.KEPT:
        return KEPT_PRIORS[sure]
    if source == DraftSource.OPENING:
        return OPENING_PRIOR
    return POOL_PRIOR


@dataclass
class AcceptanceStats:
    """Acceptance of draft tokens, by source, match length and support (each token given the ones before it landed).

    Also what the Jacobi window earns: the draft tokens that landed from its
    trajectories, per window column run (they land in later steps, as pool drafts).
    """

    # Tokens accepted and tested per bucket, each in units of ``unit``: fading every bucket at once (each observed
    # draft does) shrinks the unit instead of touching every bucket.
    accepted: dict[Bucket, float] = field(default_factory=dict)
    tested: dict[Bucket, float] = field(default_factory=dict)
    window_tokens: float = 0.0
    window_columns: float = 0.0
    unit: float = 1.0

    def p(self, b: Bucket) -> float:
        """Estimated acceptance (prior blended with what was seen)."""
        a = self.accepted.get(b, 0.0) * self.unit + _prior(b) * PRIOR_WEIGHT
        t = self.tested.get(b, 0.0) * self.unit + PRIOR_WEIGHT
        return min(a / t, MAX_P)

    def observe(self, d: Draft, n_drafted: int, n_accepted: int, fade: bool = True, sure: bool = False) -> None:
        """A draft of ``n_drafted`` tokens had its first ``n_accepted`` accepted (``fade``: first of its step)."""
        if fade:
            self.unit *= DECAY
            if self.unit < 1e-100:  # back to a unit of 1 long before the counts could overflow
                for counts in (self.tested, self.accepted):
                    for b in counts:
                        counts[b] *= self.unit
                self.unit = 1.0
        one = 1.0 / self.unit
        # Tokens tested: the accepted ones plus the first rejected one, if any.
        for k in range(min(n_accepted + 1, n_drafted)):
            b = bucket(d, k, sure)
            self.tested[b] = self.tested.get(b, 0.0) + one
            self.accepted[b] = self.accepted.get(b, 0.0) + (one if k < n_accepted else 0.0)

    def pass_over(self, b: Bucket) -> None:
        """A draft whose first token falls in ``b`` was offered and not verified: what was seen there fades a
        little."""
        if b in self.tested:
            self.tested[b] *= PASS_DECAY
            self.accepted[b] *= PASS_DECAY

    def window_gain(self) -> float:
        """Expected draft tokens one window column earns (prior blended with what was seen)."""
        return (self.window_tokens + WINDOW_PRIOR * WINDOW_PRIOR_COLUMNS) / (
            self.window_columns + WINDOW_PRIOR_COLUMNS
        )

    def observe_window(self, columns: int, landed: int) -> None:
        """A step ran ``columns`` window columns; ``landed`` draft tokens from earlier trajectories landed in it."""
        self.window_columns = self.window_columns * WINDOW_DECAY + columns
        self.window_tokens = self.window_tokens * WINDOW_DECAY + landed


def expected_tokens(p: float, length: int) -> float:
    """1 + p + ... + p^length: expected tokens of a step whose draft tokens each land with probability p."""
    return sum(p**i for i in range(length + 1))


def least_paying_p(curve: CostCurve | LiveCosts) -> float:
    """The least per-token acceptance that makes a draft of any length pay."""
    return min(break_even_p(curve, L) for L in range(1, MAX_AUTO_DRAFT + 1))


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


class _Prices:
    """A step's price list: ``prices[n]`` is the curve's cost of n rows, each looked up once, and never below a
    smaller batch's (a dip between measured sizes is noise, and pricing relies on it: see ``_best_pick``)."""

    __slots__ = ("_curve", "_values")

    def __init__(self, curve: CostCurve | LiveCosts) -> None:
        self._curve = curve
        self._values = [0.0]

    def __getitem__(self, n: int) -> float:
        values = self._values
        while len(values) <= n:
            values.append(max(self._curve.cost(len(values)), values[-1]))
        return values[n]


class _Estimate:
    """Expected tokens a step commits when it verifies the first L tokens of a draft, worked out only as far as
    pricing asks: 1 + p1 + p1*p2 + ..., each pk from the statistics (``AcceptanceStats.p``), with a short match's
    extra tokens scaled by ``trust``."""

    __slots__ = ("draft", "_stats", "_sure", "_trust", "_values", "_run", "_seen")

    def __init__(self, draft: Draft, stats: AcceptanceStats, sure: bool, trust: float) -> None:
        self.draft = draft
        self._stats = stats
        self._sure = sure
        self._trust = 1.0 if draft.match >= SHORT_MATCH else trust
        self._values = [1.0]
        self._run = 1.0
        self._seen: dict[Bucket, float] = {}  # a long draft's tokens share a few buckets

    def at(self, L: int) -> float:
        values = self._values
        while len(values) <= L:
            b = bucket(self.draft, len(values) - 1, self._sure)
            p = self._seen.get(b)
            if p is None:
                p = self._seen[b] = self._stats.p(b)
            self._run *= p
            values.append(values[-1] + self._trust * self._run)
        return values[L]

    def last_token(self, L: int) -> float:
        """What verifying token L adds; no later token adds more (each lands only if the ones before it do)."""
        return self.at(L) - self._values[L - 1]


def _best_pick(
    estimates: Sequence[_Estimate], gain: float, length: int, best_rate: float, firsts: set[int], prices: _Prices,
    room: int,
) -> tuple[_Estimate, int, float] | None:
    """The draft and length that raise a step's rate most past ``best_rate``, beside ``length`` draft tokens taken
    already (expected to commit ``gain`` tokens), with that rate; None if none does.

    Drafts whose first token one taken starts with are not alternatives. Each draft is priced one length after
    another until not even every later token adding what the last one did could beat the best rate.
    """
    pick = None
    for est in estimates:
        tokens = est.draft.tokens
        if tokens[0] in firsts:
            continue
        longest = min(len(tokens), room - length)
        for L in range(1, longest + 1):
            extra = gain - 1.0 + est.at(L)
            rate = extra / prices[1 + length + L]
            if rate > best_rate:
                best_rate, pick = rate, (est, L, rate)
            if L < longest and extra + est.last_token(L) * (longest - L) <= best_rate * prices[2 + length + L]:
                break
    return pick


class FixedPolicy:
    """The user's W, N, G as given: G ranked drafts of N-1 tokens and a W-column window."""

    def __init__(self, sources: DraftSources) -> None:
        self.sources = sources

    def choose(self, token: int, cfg: LookaheadConfig, room: int, confidence: Callable[[], float] = NO_CONFIDENCE,
               ) -> StepChoice:
        n_draft = cfg.ngram - 1
        drafts = self.sources.rank(token, min(cfg.guesses, MAX_GUESSES), n_draft)
        W = cfg.window
        while W > 0 and (W - 1) + W * (cfg.ngram - 2) + sum(len(d.tokens) for d in drafts) > room:
            W -= 1
        while len(drafts) > 1 and sum(len(d.tokens) for d in drafts) > room:
            drafts.pop()
        if drafts and len(drafts[0].tokens) > room:  # the best one, cut to what fits
            best = drafts[0]
            drafts = [replace(best, tokens=best.tokens[:room], support=best.support[:room])] if room > 0 else []
        return StepChoice(drafts=tuple(drafts), window=W, ngram=cfg.ngram if W else 0, reason="fixed")


class AutoPolicy:
    """Sizes every step from the cost curve and the acceptance seen so far.

    ``cfg`` bounds it: at most ``guesses`` drafts (0 turns drafting off) and a
    window of at most ``window`` columns. Drafts come from every source
    (``DraftSources``) and are sized here, up to MAX_AUTO_DRAFT tokens each. A
    step's rate is its expected tokens over its cost: drafts with different first
    tokens are alternatives, so their expected extra tokens add up; a window adds
    what its columns are expected to earn later. Drafts, then window columns, are
    added while the rate grows; a plain step is the rate to beat.
    """

    def __init__(self, sources: DraftSources, curve: CostCurve | LiveCosts, stats: AcceptanceStats) -> None:
        self.sources = sources
        self.stats = stats
        self.curve = curve
        # This reply's recent steps that verified a short-match draft: tokens committed and their cost in 1-token
        # steps (one step's worth of prior at rate 1); ``trust`` scales such drafts' expected extra tokens (see
        # LEDGER_DECAY).
        self.drafted_tokens = 1.0
        self.drafted_cost = 1.0
        # The least per-token acceptance that makes any draft length pay: n-gram drafts
        # are not even looked up below it (they cost a lookup per step).
        self.min_p = least_paying_p(curve)
        # The window a step without drafts takes, with what it was worked out from (see _window).
        self._no_draft_window: tuple[tuple, tuple[int, int, float]] | None = None

    def use_costs(self, curve: CostCurve | LiveCosts) -> None:
        """Price steps with ``curve`` from now on (another thread count's, say)."""
        if curve is not self.curve:
            self.curve, self.min_p = curve, least_paying_p(curve)
            self._no_draft_window = None

    def _drafts(self, token: int, cfg: LookaheadConfig, max_len: int, opening: bool) -> list[Draft]:
        """Every source's drafts for what follows ``token``; a pool is looked up only while its drafts could pay
        (whether the model was sure of ``token`` is not known yet: either way). ``opening``: ``token`` is the
        prompt's last, and n-gram drafts keep their acceptance apart (``OPENING_PRIOR``)."""
        count = min(cfg.guesses, MAX_GUESSES)
        drafts = self.sources.matches(token, max_len, count)
        p, least = self.stats.p, self.min_p
        if opening:
            if p(_OPENING) >= least:
                drafts += [replace(d, source=DraftSource.OPENING)
                           for d in self.sources.ngrams(token, count, max_len, drafts)]
            return drafts
        reply = p(_POOL_UNSURE) >= least or p(_POOL_SURE) >= least
        kept = p(_KEPT_UNSURE) >= least or p(_KEPT_SURE) >= least
        if reply or kept:
            drafts += self.sources.ngrams(token, count, max_len, drafts, reply=reply, kept=kept)
        return drafts

    def choose(self, token: int, cfg: LookaheadConfig, room: int, confidence: Callable[[], bool] = NO_CONFIDENCE,
               opening: bool = False) -> StepChoice:
        """The step after ``token``; ``confidence()`` says whether the model was sure of it (asked only when there
        are drafts to price); ``opening``: ``token`` is the prompt's last (the reply's first step)."""
        price = _Prices(self.curve)
        plain_rate = 1.0 / price[1]
        max_drafts = min(cfg.guesses, MAX_GUESSES)
        drafts = self._drafts(token, cfg, min(MAX_AUTO_DRAFT, room), opening) if max_drafts > 0 else []
        chosen: list[Draft] = []
        reasons: list[str] = []
        gain, length, best_rate = 1.0, 0, plain_rate
        firsts: set[int] = set()
        sure = bool(drafts) and confidence()
        if drafts:
            trust = self.trust
            estimates = [_Estimate(d, self.stats, sure, trust) for d in drafts]
            while len(chosen) < max_drafts:
                pick = _best_pick(estimates, gain, length, best_rate, firsts, price, room)
                if pick is None:
                    break
                est, L, best_rate = pick
                d = est.draft
                chosen.append(Draft(d.tokens[:L], d.source, d.match, d.support[:L], d.origin))
                reasons.append(f"{d.origin or d.source} match {d.match}, L={L}")
                firsts.add(d.tokens[0])
                gain += est.at(L) - 1.0
                length += L
            for b in {bucket(d, 0, sure) for d in drafts if d.tokens[0] not in firsts}:
                self.stats.pass_over(b)
        W, N, best_rate = self._window(gain, length, best_rate, cfg, room)
        if not chosen and not W:
            return StepChoice(reason="plain: no draft worth its cost", expected_gain=1.0)
        reason = "; ".join(reasons) + f", expect {gain:.2f} tokens" if chosen else "no draft"
        if W:
            reason += f" + window {W}x{N - 1}"
        return StepChoice(
            drafts=tuple(chosen),
            window=W,
            ngram=N if W else 0,
            reason=reason,
            expected_gain=best_rate / plain_rate,
        )

    def _window(
        self, gain: float, length: int, best_rate: float, cfg: LookaheadConfig, room: int,
    ) -> tuple[int, int, float]:
        """The window (W, N) that most raises a step's rate past ``best_rate`` beside ``length`` draft tokens
        expected to commit ``gain`` tokens, with that rate; (0, 0, best_rate) when none does.

        Its columns of N-1 levels are each expected to earn ``window_gain()`` tokens in later steps. The answer
        for a step without drafts is kept until what it depends on changes: it is asked after most tokens.
        """
        per_column = self.stats.window_gain()
        widest = min(cfg.window, MAX_WINDOW)
        deepest = max(3, min(cfg.ngram, 4))
        key = None
        if not length:  # (room beyond the largest window's rows changes nothing)
            key = (per_column, widest, deepest, min(room, widest * (deepest - 1)), getattr(self.curve, "version", 0))
            if self._no_draft_window is not None and self._no_draft_window[0] == key:
                return self._no_draft_window[1]
        W = N = 0
        n = 1 + length
        # Every window adds a row at least, and a step costs more the more rows it has and the more of them give
        # logits: where the largest window's tokens at the price of one more row with one logit lose, none wins.
        most = gain + per_column * widest
        ngrams = range(3, deepest + 1) if most > best_rate * self.curve.cost(n + 1, 1) else range(0)
        for ngram in ngrams:
            for w in range(1, widest + 1):
                extra = (w - 1) + w * (ngram - 2)
                if extra > room - length:
                    break
                rate = (gain + per_column * w) / self.curve.cost(n + extra, n + w)
                if rate > best_rate:
                    best_rate, W, N = rate, w, ngram
        if key is not None:
            self._no_draft_window = (key, (W, N, best_rate))
        return W, N, best_rate

    def observe(
        self,
        choice: StepChoice,
        committed: Sequence[int],
        accepted_origin: str,
        n_accepted: int,
        sure: bool = False,
    ) -> None:
        """Learn from a step chosen after a token the model was ``sure`` of: how far each draft agreed with the
        committed tokens, and what the window earned."""
        for k, d in enumerate(choice.drafts):
            agree = 0
            while agree < min(len(d.tokens), len(committed)) and d.tokens[agree] == committed[agree]:
                agree += 1
            self.stats.observe(d, len(d.tokens), agree, fade=k == 0, sure=sure)
        landed = n_accepted if accepted_origin == DraftOrigin.WINDOW else 0
        if choice.window or landed:
            self.stats.observe_window(choice.window, landed)

    @property
    def trust(self) -> float:
        """How much of the extra tokens the statistics expect of a short-match draft Auto counts on: 1 while this
        reply's recent steps that verified one paid, less the more they lost."""
        return min(self.drafted_tokens / self.drafted_cost, 1.0) ** TRUST_POWER

    def observe_cost(self, choice: StepChoice, n_committed: int, cost: float) -> None:
        """A step of ``choice`` committed ``n_committed`` tokens and cost ``cost`` 1-token steps (its measured time
        over a 1-token step's; read only where the step verified drafts)."""
        if choice.drafts and choice.drafts[0].match < SHORT_MATCH:
            self.drafted_tokens = self.drafted_tokens * LEDGER_DECAY + n_committed
            self.drafted_cost = self.drafted_cost * LEDGER_DECAY + max(cost, 1.0)
        elif not choice.drafts:
            self.drafted_tokens += (self.drafted_cost - self.drafted_tokens) * LEDGER_RETURN
