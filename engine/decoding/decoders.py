"""Plain and lookahead decoding behind one interface.

A decoder turns the pending tokens (committed, not yet in the KV cache) into
one forward pass and reports what it committed. ``Generation`` (generation.py)
owns the loop, the stop rules and the text; decoders own the batch and the cache
clean-up of their step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from engine.decoding.grammar import GrammarState
from engine.decoding.origins import DraftOrigin
from engine.decoding.plan import ALL_SEQS, StepChoice, StepPlan, build_step
from engine.decoding.pool import NgramPool
from engine.llama.native import Batch, Context, Sampler


@dataclass
class KvState:
    """What the cache holds: ``tokens`` at positions 0..n-1, in every sequence."""

    tokens: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.tokens)


# The model was sure of a token when it was at least SURE_LEAD times as likely as any other (its logit at least
# ln SURE_LEAD above every other one): text being copied or written by rote, where drafts land more often than in
# free writing (Auto keeps their acceptance apart). Every token with a probability of 0.9 or more is; one pass
# over the logits decides it, quicker than a softmax over the vocabulary.
SURE_LEAD = 9.0
_LEAD = math.log(SURE_LEAD)


def is_sure(row: np.ndarray, token: int) -> bool:
    """Whether ``token``'s logit in ``row`` leads every other one by ln SURE_LEAD or more."""
    return int(np.count_nonzero(row > row[token] - _LEAD)) <= 1


class Confidence:
    """Whether the model was sure of a committed token (``is_sure``), worked out the first time it is called.

    Auto asks only before a step that has drafts to price, and a pass over the vocabulary's logits costs about
    half a percent of a small model's step. It reads the decode's own logits buffer, so it must be called before the
    next decode or not at all.
    """

    __slots__ = ("_row", "_token", "_value")

    def __init__(self, row: np.ndarray | None = None, token: int = 0, sure: bool = False) -> None:
        self._row, self._token = row, token
        self._value: bool | None = None if row is not None else sure

    def __call__(self) -> bool:
        if self._value is None:
            assert self._row is not None
            self._value, self._row = is_sure(self._row, self._token), None
        return self._value


NO_CONFIDENCE = Confidence()  # not asked for: not sure
GIVEN = Confidence(sure=True)  # a token the grammar allowed alone, drawn without logits


@dataclass
class StepOutcome:
    committed: list[int]
    batch_size: int
    n_logits: int
    n_drafted: int  # candidate tokens verified this step
    n_accepted: int  # of those, accepted
    n_reevaluated: int  # accepted drafts of the previous step evaluated again
    window: int
    ngram: int
    guesses: int
    n_cached: int = 0  # leading committed tokens already in the KV cache
    accepted_origin: str = ""  # where the accepted draft tokens came from (Draft.origin); "" if none
    # Whether the model was sure of the last committed token (what the next step follows); not unless asked for.
    confidence: Confidence = NO_CONFIDENCE
    top2_gaps: list[float] = field(default_factory=list)
    decode_s: float = 0.0


class TokenDrawer:
    """Draws emitted tokens: argmax of the raw row when nothing changes the logits, else the sampler chain;
    under a grammar, among the tokens it allows.

    Each emitted position is drawn exactly once, in order, in every decoder, so
    a fixed seed gives the same stream whatever the decoding mode, and the
    repetition penalty and the grammar see the same history: a draft token
    reaches them only as the draw at its position.
    """

    def __init__(self, ctx: Context, sampler: Sampler | None, grammar: GrammarState | None = None) -> None:
        self.ctx = ctx
        self.sampler = sampler
        self.grammar = grammar

    def draw(self, batch_index: int, logits_row: np.ndarray | None) -> int:
        """The token at ``batch_index``; its logits may be None where the grammar allows one token only."""
        grammar = self.grammar
        if grammar is None:
            if self.sampler is None:
                assert logits_row is not None
                return int(np.argmax(logits_row))
            return self.sampler.sample(self.ctx, batch_index)
        tok = grammar.given()
        if tok is not None:  # no choice to draw: the sampler's history takes it as drawn
            if self.sampler is not None:
                self.sampler.accept((tok,))
        elif logits_row is None:
            raise RuntimeError("a position the grammar leaves open was decoded without logits")
        elif self.sampler is None:
            tok = int(np.argmax(logits_row))
            if not grammar.allows(tok):  # masking the whole row only where the model's choice is not allowed
                grammar.mask(logits_row)
                tok = int(np.argmax(logits_row))
        else:  # the sampler reads the decode's logits buffer, which ``logits_row`` is a view of
            grammar.mask(logits_row)
            tok = self.sampler.sample(self.ctx, batch_index)
        grammar.commit(tok)
        return tok

    def given(self, limit: int) -> tuple[int, ...]:
        """Up to ``limit`` tokens from the next position on that the grammar allows alone (their rows need no
        logits)."""
        return self.grammar.forced(limit) if self.grammar is not None else ()


def _confidence(row: np.ndarray | None, token: int) -> Confidence:
    return Confidence(row, token) if row is not None else GIVEN


def top2_gap(row: np.ndarray) -> float:
    top = np.partition(row, -2)[-2:]
    return float(abs(top[1] - top[0]))


class PlainDecoder:
    """One token per forward pass: the reference the lookahead output must equal."""

    name = "plain"

    def __init__(
        self,
        ctx: Context,
        batch: Batch,
        drawer: TokenDrawer,
        seqs: tuple[int, ...] = ALL_SEQS,
        record_gaps: bool = True,
    ) -> None:
        self.ctx = ctx
        self.batch = batch
        self.drawer = drawer
        self.seqs = seqs  # sequence ids every committed token carries
        self.record_gaps = record_gaps

    def step(self, kv: KvState, pending: list[int], confidence: bool = False) -> StepOutcome:
        """One token; ``confidence``: also report whether the model was sure of it (``Confidence``). A token the
        grammar gives needs no logits: the pass only puts ``pending`` into the cache."""
        given = bool(self.drawer.given(1))
        self.batch.set_single_seq(pending, kv.n, self.seqs, last_logits=not given)
        t0 = time.perf_counter()
        self.ctx.decode(self.batch)
        decode_s = time.perf_counter() - t0
        kv.tokens.extend(pending)
        row = None if given else self.ctx.logits_rows(1)[0]
        tok = self.drawer.draw(len(pending) - 1, row)
        gaps = [top2_gap(row) if row is not None else math.inf] if self.record_gaps else []
        return StepOutcome(
            committed=[tok],
            batch_size=len(pending),
            n_logits=0 if given else 1,
            n_drafted=0,
            n_accepted=0,
            n_reevaluated=len(pending) - 1,
            window=0,
            ngram=0,
            guesses=0,
            top2_gaps=gaps,
            decode_s=decode_s,
            confidence=_confidence(row, tok) if confidence else NO_CONFIDENCE,
        )


class JacobiWindow:
    """W columns x (N-1) levels of Jacobi guesses, kept aligned to positions.

    Level j of column i guesses the token at P + j + i (P = the input token's
    position); level 0 of column 0 is the input token itself.
    """

    def __init__(self, seed_tokens: list[int], rng_seed: int = 0) -> None:
        self._rng = np.random.default_rng(rng_seed)
        self._seed_tokens = np.asarray(seed_tokens or [0], dtype=np.int32)
        self.levels = np.zeros((0, 0), dtype=np.int32)

    def _fresh(self, shape: tuple[int, int]) -> np.ndarray:
        return self._rng.choice(self._seed_tokens, size=shape).astype(np.int32)

    def resize(self, window: int, ngram: int) -> None:
        shape = (ngram - 1, window) if window > 0 else (0, 0)
        if self.levels.shape == shape:
            return
        fresh = self._fresh(shape)
        lv = min(self.levels.shape[0], shape[0])
        w = min(self.levels.shape[1], shape[1])
        if lv and w:  # keep the guesses that still fit
            fresh[:lv, :w] = self.levels[:lv, :w]
        self.levels = fresh

    def harvest(self, input_token: int, preds: np.ndarray, pool: NgramPool) -> None:
        """Each column's trajectory is an n-gram: the token it starts from, its levels, its prediction."""
        levels, W = self.levels.shape
        self.levels[0, 0] = input_token
        for i in range(W):
            cont = [int(t) for t in self.levels[1:, i]] + [int(preds[i])]
            pool.add(int(self.levels[0, i]), cont, DraftOrigin.WINDOW)

    def advance(self, preds: np.ndarray, shift: int) -> None:
        """Move the window ``shift`` positions on: column i takes column i + shift - 1's next levels."""
        levels, W = self.levels.shape
        new = self._fresh((levels, W))
        src = np.arange(W) + shift - 1
        ok = src < W
        if levels > 1:
            new[: levels - 1, ok] = self.levels[1:, src[ok]]
        new[levels - 1, ok] = preds[src[ok]]
        self.levels = new


class LookaheadDecoder:
    """One forward pass holding the Jacobi window and the verification candidates.

    The accepted prefix is the longest run of candidate tokens that equal what
    the model itself draws at each position; a step commits 1 + that many.
    """

    name = "lookahead"

    def __init__(
        self,
        ctx: Context,
        batch: Batch,
        drawer: TokenDrawer,
        pool: NgramPool,
        window: JacobiWindow,
    ) -> None:
        self.ctx = ctx
        self.batch = batch
        self.drawer = drawer
        self.pool = pool
        self.window = window

    def step(self, kv: KvState, pending: list[int], choice: StepChoice, confidence: bool = False) -> StepOutcome:
        """One step holding ``choice``'s drafts and window (already sized to fit); ``confidence`` as PlainDecoder's."""
        input_token = pending[-1]
        candidates = [d.tokens for d in choice.drafts]
        W = choice.window
        if W:
            self.window.resize(W, choice.ngram)
        longest = max(map(len, candidates), default=0)
        plan = build_step(pending, kv.n, candidates, self.window.levels if W else None,
                          self.drawer.given(longest + 1))

        self.batch.set_plan(plan.tokens, plan.positions, plan.seq_ids, plan.logits)
        t0 = time.perf_counter()
        self.ctx.decode(self.batch)
        decode_s = time.perf_counter() - t0
        rows = plan.rows
        logits = self.ctx.logits_rows(plan.n_logits)

        committed, path, last_row = self._verify(plan, rows, logits)

        if plan.window:
            preds = np.argmax(logits[[rows[i] for i in plan.window_pred_index]], axis=1)
            self.window.harvest(input_token, preds, self.pool)
            self.window.advance(preds, len(committed))
        if path:
            self.pool.observe_accepted(input_token, committed[: len(path)])

        n_kept = self._clean_cache(plan, path)
        kv.tokens.extend(pending)
        kv.tokens.extend(committed[:n_kept])
        return StepOutcome(
            committed=committed,
            batch_size=plan.size,
            n_logits=plan.n_logits,
            n_drafted=len(plan.nodes),
            n_accepted=len(path),
            n_reevaluated=len(pending) - 1,
            window=plan.window,
            ngram=choice.ngram if plan.window else (1 + max(map(len, candidates)) if candidates else 0),
            guesses=len(candidates),
            n_cached=n_kept,
            decode_s=decode_s,
            accepted_origin=_origin_of(choice, committed[: len(path)]),
            confidence=_confidence(last_row, committed[-1]) if confidence else NO_CONFIDENCE,
        )

    def _verify(
        self, plan: StepPlan, rows: list[int], logits: np.ndarray
    ) -> tuple[list[int], list[int], np.ndarray | None]:
        """Walk the candidate tree along the model's own draws: (committed, accepted nodes, the last draw's row)."""
        committed: list[int] = []
        path: list[int] = []
        idx = plan.input_index
        children = plan.root_children
        while True:
            row = logits[rows[idx]] if rows[idx] >= 0 else None
            tok = self.drawer.draw(idx, row)
            committed.append(tok)
            child = children.get(tok)
            if child is None:
                return committed, path, row
            path.append(child)
            node = plan.nodes[child]
            idx = node.batch_index
            children = node.children

    def _clean_cache(self, plan: StepPlan, path: list[int]) -> int:
        """Drop every speculative entry; keep accepted drafts that sit in position order.

        Returns how many accepted drafts stayed in the cache; the rest are
        re-evaluated at the front of the next step.
        """
        P = plan.input_pos
        if plan.size == plan.n_pending:
            return 0
        in_place = plan.in_place_prefix(path)
        keep_to = P + 1 + in_place
        self.ctx.seq_rm(-1, keep_to, -1)
        if in_place:
            # Kept best-path cells already carry seq 0 and every idle sequence;
            # the sequences used this step get them by copy, after losing their
            # own (rejected) tokens in that range.
            for s in plan.missing_seqs(path[in_place - 1]):
                self.ctx.seq_rm(s, P + 1, keep_to)
                self.ctx.seq_cp(0, s, P + 1, keep_to)
        return in_place


class ChainDecoder:
    """Verification of one draft on a model whose memory keeps one state per sequence (recurrent or hybrid).

    The batch is the pending tokens, then the draft, all in the committed sequence, with logits from the last
    pending token on. The accepted part of the draft stays in the cache where plain decoding would have put
    it; the rejected tail is taken back (``Context.rollback``: llama.cpp returns the recurrent state to the
    one it kept that many tokens back), which the caller keeps within the context's ``n_rs_seq``.
    """

    name = "drafts"

    def __init__(self, ctx: Context, batch: Batch, drawer: TokenDrawer, seq: int = 0) -> None:
        self.ctx = ctx
        self.batch = batch
        self.drawer = drawer
        self.seq = seq

    def step(self, kv: KvState, pending: list[int], choice: StepChoice, confidence: bool = False) -> StepOutcome:
        draft = list(choice.drafts[0].tokens)
        n_pending = len(pending)
        self.batch.set_single_seq(pending + draft, kv.n, (self.seq,), last_logits=False)
        self.batch.logits[n_pending - 1 : n_pending + len(draft)] = 1
        t0 = time.perf_counter()
        self.ctx.decode(self.batch)
        decode_s = time.perf_counter() - t0
        logits = self.ctx.logits_rows(len(draft) + 1)
        committed: list[int] = []
        for k in range(len(draft) + 1):  # the model's own draw at each position, while it agrees with the draft
            committed.append(self.drawer.draw(n_pending - 1 + k, logits[k]))
            if k == len(draft) or committed[-1] != draft[k]:
                break
        n_accepted = len(committed) - 1
        if n_accepted < len(draft):
            self.ctx.rollback(self.seq, kv.n + n_pending + n_accepted)
        kv.tokens.extend(pending)
        kv.tokens.extend(draft[:n_accepted])
        return StepOutcome(
            committed=committed,
            batch_size=n_pending + len(draft),
            n_logits=len(draft) + 1,
            n_drafted=len(draft),
            n_accepted=n_accepted,
            n_reevaluated=n_pending - 1,
            window=0,
            ngram=1 + len(draft),
            guesses=1,
            n_cached=n_accepted,
            decode_s=decode_s,
            accepted_origin=choice.drafts[0].origin if n_accepted else "",
            confidence=Confidence(logits[n_accepted], committed[-1]) if confidence else NO_CONFIDENCE,
        )


def _origin_of(choice: StepChoice, accepted: list[int]) -> str:
    """The origin of the first-ranked draft that holds the accepted tokens ("" when none were accepted)."""
    if not accepted:
        return ""
    n = len(accepted)
    for d in choice.drafts:
        if list(d.tokens[:n]) == accepted:
            return d.origin
    return ""
