"""Choosing each step's shape: fixed W/N/G, or Auto from the cost curve and live acceptance.

A step that verifies a draft of L tokens costs ``cost(1 + L)`` and commits on
average ``1 + p1 + p1*p2 + ... + p1*...*pL`` tokens, where pk is the chance
that draft token k lands given the ones before it did. Auto picks the draft and
length with the best expected tokens per unit of cost, and takes a plain step
when no draft beats ``1 / cost(1)``.

pk is learned while generating, from priors, per kind of draft (acceptance.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from engine.costs.curve import CostCurve, LiveCosts
from engine.decoding.acceptance import MAX_P, AcceptanceStats, Bucket, bucket
from engine.decoding.decoders import NO_CONFIDENCE
from engine.decoding.drafts import ALONE, FORCED, LIKELY, Draft, DraftSources
from engine.decoding.origins import DraftOrigin, DraftSource
from engine.decoding.plan import StepChoice
from engine.decoding.settings import MAX_GUESSES, MAX_WINDOW, LookaheadConfig

# Longest history draft Auto verifies in one step. Drafts are not bound by N, the
# window's n-gram size: a long copy of earlier text can land 15 tokens at a time.
MAX_AUTO_DRAFT = 15


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

_GRAMMARS = (FORCED, LIKELY)  # supports of the text a grammar forces
_POOL_UNSURE: Bucket = (DraftSource.POOL, 1, ALONE, False)
_POOL_SURE: Bucket = (DraftSource.POOL, 1, ALONE, True)
_KEPT_UNSURE: Bucket = (DraftSource.KEPT, 1, ALONE, False)
_KEPT_SURE: Bucket = (DraftSource.KEPT, 1, ALONE, True)
_OPENING: Bucket = (DraftSource.OPENING, 1, ALONE, False)  # the token before is the prompt's: never sure


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
    smaller batch's (a dip between measured sizes is noise, and pricing relies on it: see ``_best_pick``).

    The first ``given`` rows predict tokens a grammar allows alone and get no logits (plan.build_step): every
    draft of such a step starts with those tokens, so its first rows are those.
    """

    __slots__ = ("_curve", "_given", "_values")

    def __init__(self, curve: CostCurve | LiveCosts, given: int = 0) -> None:
        self._curve = curve
        self._given = given
        self._values = [0.0]

    def __getitem__(self, n: int) -> float:
        values = self._values
        while len(values) <= n:
            rows = len(values)
            values.append(max(self._curve.cost(rows, rows - min(self._given, rows)), values[-1]))
        return values[n]


class _Estimate:
    """Expected tokens a step commits when it verifies the first L tokens of a draft, worked out only as far as
    pricing asks: 1 + p1 + p1*p2 + ..., each pk from the statistics (``AcceptanceStats.p``), with a short match's
    extra tokens scaled by ``trust`` (not those of the text a grammar forces, which a draft may lead with)."""

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
            trust = 1.0 if b[2] in _GRAMMARS else self._trust  # the grammar's text is no coincidence
            values.append(values[-1] + trust * self._run)
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


class _Unverified:
    """Drafts a step was offered and did not verify, checked against the tokens the reply goes on to commit.

    The reply's text is plain decoding's, so a draft lands exactly where its tokens are the reply's: how far an
    unverified one agrees with what is committed after it is what verifying it would have shown, and teaches the
    statistics the same. Without it a bucket whose drafts Auto stopped verifying would never be seen again, and
    one it never verified would keep its prior however often its drafts would have landed.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        # [draft, sure, tokens of it that agree so far]; each starts at the position after the step that offered it
        self._pending: list[list] = []

    def add(self, drafts: Sequence[Draft], sure: bool) -> None:
        self._pending.extend([d, sure, 0] for d in drafts)

    def settle(self, committed: Sequence[int], stats: AcceptanceStats, fade: bool) -> None:
        """The reply grew by ``committed``: every draft whose fate these tokens decide teaches ``stats``."""
        left = []
        for entry in self._pending:
            d, sure, before = entry
            agree = before + _agreement(d.tokens[before:], committed)
            if agree == len(d.tokens) or agree - before < len(committed):  # all of it seen, or where it parts
                stats.observe(d, len(d.tokens), agree, fade=fade, sure=sure)
                fade = False
            else:
                entry[2] = agree
                left.append(entry)
        self._pending = left


def _agreement(tokens: Sequence[int], committed: Sequence[int]) -> int:
    """How many of ``tokens`` the ``committed`` tokens begin with."""
    n = min(len(tokens), len(committed))
    return next((k for k in range(n) if tokens[k] != committed[k]), n)


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
        self._unverified = _Unverified()

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
        max_drafts = min(cfg.guesses, MAX_GUESSES)
        drafts = self._drafts(token, cfg, min(MAX_AUTO_DRAFT, room), opening) if max_drafts > 0 else []
        price = _Prices(self.curve, drafts[0].leading(FORCED) if drafts else 0)
        plain_rate = 1.0 / price[1]
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
            self._unverified.add([d for d in drafts if d.tokens[0] not in firsts], sure)
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
        committed tokens (the drafts it verified, and those of earlier steps it did not: ``_Unverified``), and
        what the window earned."""
        for k, d in enumerate(choice.drafts):
            self.stats.observe(d, len(d.tokens), _agreement(d.tokens, committed), fade=k == 0, sure=sure)
        self._unverified.settle(committed, self.stats, fade=not choice.drafts)
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
