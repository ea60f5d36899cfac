"""One reply: the decoding loop from a prompt to a stop, one ``StepEvent`` per forward pass.

``Engine`` (runtime.py) holds the model, the context and the KV cache and lasts
across replies. A ``Generation`` holds what lives for one reply: the sampler,
the decoders, the n-gram pool and history index, the step policies, where the
reply ends and the tokens still pending. Each ``step()`` is one forward pass,
in the order of llama.cpp's lookahead example loop:

    1. end with a closing event (mode "none") if cancelled or the context is full;
    2. choose the step's shape: plain, the user's W/N/G or Auto (auto.py), kept
       within the batch size measured to give exact logits;
    3. decode it and verify its drafts: ``PlainDecoder``, ``LookaheadDecoder`` or
       ``ChainDecoder`` (decoders.py, which owns the acceptance rule and the cache
       clean-up; plan.py lays out the batch);
    4. Auto's feedback: how far each draft agreed with what the model committed;
    5. stops: cut the committed tokens at end-of-generation, a loop, max_tokens
       or a stop string (stops.py); the reply and its pool of n-grams grow;
    6. price the step on the live cost curve, which it teaches, and report it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from engine.costs.cost_model import CostModel
from engine.decoding.acceptance import AcceptanceStats
from engine.decoding.auto import AutoPolicy, FixedPolicy
from engine.decoding.decoders import (
    NO_CONFIDENCE,
    ChainDecoder,
    JacobiWindow,
    LookaheadDecoder,
    PlainDecoder,
    StepOutcome,
    TokenDrawer,
)
from engine.decoding.draft_store import DraftStore
from engine.decoding.drafts import DraftSources, HistoryIndex
from engine.decoding.dry import dry_screen
from engine.decoding.grammar import GrammarState
from engine.decoding.loaded import LoadedModel
from engine.decoding.origins import OWN, DraftOrigin
from engine.decoding.plan import StepChoice
from engine.decoding.pool import NgramPool
from engine.decoding.prompt_cache import PromptCache
from engine.decoding.settings import MAX_NGRAM, LookaheadConfig, SamplingConfig, StopConfig
from engine.decoding.stops import ReplyEnd
from engine.decoding.text_match import TextIndex
from engine.llama.native import Model, Sampler


class EngineState(Protocol):
    """What a generation uses of the engine that runs it (``engine.decoding.runtime.Engine``): its parts.

    The engine lasts across replies (model, context, cache, what drafts come from, what steps cost); a
    generation is one reply. Named here so that this module does not import the engine that imports it.
    """

    @property
    def loaded(self) -> LoadedModel: ...
    @property
    def cache(self) -> PromptCache: ...
    @property
    def costs(self) -> CostModel: ...
    @property
    def drafts(self) -> DraftStore: ...
    @property
    def acceptance(self) -> AcceptanceStats: ...


@dataclass(frozen=True)
class StepEvent:
    """One forward pass of a generation, as reported to the caller."""

    step: int
    mode: str  # "plain" | "lookahead" | "auto" (what the user asked for; the shape says what ran)
    token_ids: tuple[int, ...]
    text: str
    n_committed: int
    batch_size: int
    n_logits: int
    n_drafted: int
    n_accepted: int
    n_reevaluated: int
    window: int
    ngram: int
    guesses: int
    elapsed_s: float  # wall time of the step
    decode_s: float  # of which llama_decode
    # The prompt (first step only): its tokens, of which ``prefill_tokens`` were evaluated before this step in
    # ``prefill_s``; the rest but the last were in the cache already (reused from the previous turn), and the
    # last is evaluated by this step.
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    top2_gaps: tuple[float, ...] = ()
    stop_reason: str | None = None  # set on the last event
    stop_string: str = ""  # the stop string that ended the reply (with stop_reason "stop_string")
    notice: str = ""  # e.g. context policy applied
    # Set by ChatSession on the first step: the oldest messages left out to fit the context, and the
    # prompt tokens the system prompt takes.
    dropped_messages: int = 0
    system_tokens: int = 0
    choice: str = ""  # why the step had this shape (Auto explains itself here)
    # Where this step's accepted draft tokens came from (a DraftOrigin; "" when none landed).
    draft_origin: str = ""
    # One entry per token of ``token_ids``: OWN for the token the model picked itself at the end of the step
    # (every plain step's), else the ``draft_origin`` of the verified draft it came from.
    token_sources: tuple[str, ...] = ()
    # One entry per token of ``token_ids``: the text it added to ``text`` ("" while a character's bytes or a
    # possible stop string are held back; the held text comes with a later token). They join to ``text``.
    token_texts: tuple[str, ...] = ()
    # The threads this step's decode ran with, of the ``max_threads`` the engine may use (fewer while another
    # program holds a core, see contention.py); ``kept_threads``: the count the thread governor keeps (a step
    # on trial runs with one more or fewer; 0: not known); ``contended``: the recent decodes' threads waited
    # for cores, by this PC's measure at rest.
    threads: int = 0
    max_threads: int = 0
    kept_threads: int = 0
    contended: bool = False
    # This forward pass priced on the engine's live cost curve, in 1-token steps (a plain step costs 1.0; 0.0:
    # no forward pass). Tokens over summed costs is what the steps alone predict against plain decoding.
    cost: float = 0.0

    @property
    def reduced(self) -> bool:
        """True when the governor keeps fewer threads than the engine may use (another program holds a core)."""
        return 0 < self.kept_threads < self.max_threads

    @property
    def prompt_cached_tokens(self) -> int:
        """Prompt tokens that were in the cache already (first step only)."""
        return max(self.prompt_tokens - self.prefill_tokens - 1, 0) if self.prompt_tokens else 0


@dataclass
class GenerationControls:
    """Settings a caller may change while a generation runs; read before every step."""

    lookahead: LookaheadConfig | None = None  # None = plain decoding
    cancel: threading.Event = field(default_factory=threading.Event)
    # Hears (prompt tokens read, prompt tokens to read) while the prompt is read, before the first step.
    on_prompt: Callable[[int, int], None] | None = None


class Generation:
    """One reply in progress: built per ``Engine.generate`` call, advanced one forward pass per ``step()``.

    Building it brings the engine's cache up to ``prompt[:-1]`` (reusing the
    cached prefix); the last prompt token is evaluated by the first step. It
    owns its sampler: ``close()`` frees it. Arguments are those of
    ``Engine.generate``, already validated there.
    """

    def __init__(
        self,
        engine: EngineState,
        prompt: list[int],
        controls: GenerationControls,
        sampling: SamplingConfig,
        stop: StopConfig,
        history: list[int],
        notice: str,
        record_gaps: bool,
        exact_only: bool,
        grammar: GrammarState | None = None,
    ) -> None:
        self._loaded, self._cache, self._costs, self._store = engine.loaded, engine.cache, engine.costs, engine.drafts
        self._controls = controls
        self._notice = notice
        self._exact_only = exact_only
        self._n_history = len(history)
        self._reply_end = ReplyEnd(engine.loaded.model, stop, prompt,
                                   close=grammar.close_now if grammar is not None else None)

        t0 = time.perf_counter()
        self._prefill_tokens = self._cache.cache_prompt(prompt, controls.on_prompt, controls.cancel)
        self._prefill_s = time.perf_counter() - t0

        self._pool_grew = False  # lookahead steps added the reply's n-grams to the pool: worth keeping
        self._sampler = _open_sampler(engine.loaded.model, sampling, prompt)
        try:
            self._set_up_decoding(engine, prompt, history, sampling, record_gaps, grammar)
        except BaseException:
            self.close()
            raise
        self._n_prompt = len(prompt)
        self._tokens = list(prompt)  # prompt + reply so far
        self._pool_synced = len(self._tokens)  # the pool holds the n-grams of tokens[:pool_synced]
        self._pending = [prompt[-1]]  # committed tokens not yet in the KV cache
        self._n_steps = 0
        self._confidence = NO_CONFIDENCE  # was the model sure of the last committed token (Auto's steps depend on it)
        self._finished = False

    def _set_up_decoding(
        self,
        engine: EngineState,
        prompt: list[int],
        history: list[int],
        sampling: SamplingConfig,
        record_gaps: bool,
        grammar: GrammarState | None,
    ) -> None:
        """The decoders, the reply's n-gram pool and history index, and the policies that draft from them."""
        loaded = engine.loaded
        ctx, batch = loaded.ctx, loaded.batch
        drawer = TokenDrawer(ctx, self._sampler, grammar)
        self._grammar = grammar
        self._plain = PlainDecoder(ctx, batch, drawer, loaded.commit_seqs, record_gaps=record_gaps)
        self._pool = NgramPool(max_len=MAX_NGRAM - 1)
        self._pool.add_tokens(history, origin=DraftOrigin.HISTORY)
        self._pool.add_tokens(prompt, origin=DraftOrigin.PROMPT)
        self._index = HistoryIndex()
        self._index.extend(history, DraftOrigin.HISTORY)
        self._index.extend(prompt, DraftOrigin.PROMPT)
        self._lookahead = LookaheadDecoder(ctx, batch, drawer, self._pool, JacobiWindow(prompt))
        self._chain = ChainDecoder(ctx, batch, drawer, loaded.commit_seqs[0])
        self._screen = dry_screen(sampling, prompt, loaded.model.is_dry_breaker)
        screens = tuple(s for s in (grammar, self._screen) if s is not None)
        store = engine.drafts
        model = loaded.model
        # Under a grammar a copied value starts after a quote, never as the prompt's token: there text matches
        # pay; in free text the token matches find the copies, and text matches mostly add chance ones.
        text = (TextIndex(self._index, model.token_bytes, model.text_tokens)
                if grammar is not None else None)
        sources = DraftSources(self._index, self._pool, store.corpus, store.kept, store.documents, screens, grammar,
                               text)
        self._fixed = FixedPolicy(sources)
        self._auto = AutoPolicy(sources, engine.costs.live_costs, engine.acceptance)

    @property
    def finished(self) -> bool:
        """True once the event with the stop reason has been returned."""
        return self._finished

    def step(self) -> StepEvent | None:
        """Run one forward pass and report it (the module's steps 1-6); None once the generation has ended."""
        if self._finished:
            return None
        if self._controls.cancel.is_set():
            return self._end("cancelled")
        budget = min(self._loaded.ctx.n_batch, self._loaded.n_ctx - self._cache.kv.n)
        if budget < len(self._pending) + 1:
            return self._end("context_full")
        cfg = self._controls.lookahead
        auto = cfg is not None and cfg.auto  # only Auto reads the committed token's probability
        started = time.perf_counter()
        choice = self._choose(cfg, budget)  # 2. the step's shape
        out = self._decode(choice, auto)  # 3. one forward pass, its drafts verified
        if auto:
            self._learn_from_drafts(choice, out)  # 4. Auto's feedback
        committed, pieces, reason = self._reply_end.cut(out.committed)  # 5. stops
        if reason == "eog" and self._grammar is not None and self._grammar.wrapped:
            reason = "max_tokens"  # closed early to end within the limit: cut short all the same
        self._commit(out, committed, grow_pool=cfg is not None)
        # Wall time, not just llama_decode's: a lookahead step's planning and cache clean-up are part of what it
        # costs.
        elapsed = time.perf_counter() - started
        threads, cost = self._learn_costs(choice, out, elapsed, auto)  # 6. its price, learned
        event = self._event(cfg, choice, out, committed, pieces, reason, elapsed, threads, cost)
        self._n_steps += 1
        self._finished = bool(reason)
        return event

    def close(self) -> None:
        """Free the sampler and hand the reply's n-grams to the engine's kept pool (safe to call twice)."""
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None
        if self._pool_grew:
            self._store.keep_ngrams(self._pool)
            self._pool_grew = False

    def _choose(self, cfg: LookaheadConfig | None, budget: int) -> StepChoice:
        """This step's shape, kept within the batch size whose logits match a lone decode's."""
        loaded = self._loaded
        cap = self._costs.curve.max_exact_batch if self._exact_only else budget
        room = min(budget, cap) - len(self._pending)
        if cfg is None:
            return StepChoice(reason="plain")
        if loaded.drafts_only:  # one draft, no window, no longer than the memory can take back
            cfg = replace(cfg, window=0, guesses=min(cfg.guesses, 1))
            room = min(room, loaded.rollback)
        if cap < 2:
            return StepChoice(reason="plain: on this CPU no batch gives this model's logits of plain decoding")
        if room < 1:
            return StepChoice(reason="plain")
        indexed = len(self._index) - self._n_history  # the index holds the history, then these
        if indexed < len(self._tokens):  # catch up after plain steps
            self._index.extend(self._tokens[indexed:], DraftOrigin.REPLY)
        if cfg.auto:
            self._auto.use_costs(self._costs.live_costs)  # the thread count may have changed since the last step
            return self._auto.choose(self._pending[-1], cfg, room, self._confidence, opening=self._n_steps == 0)
        return self._fixed.choose(self._pending[-1], cfg, room, self._confidence)

    def _decode(self, choice: StepChoice, confidence: bool) -> StepOutcome:
        """The step's forward pass, its drafts verified by the decoder that ran it; ``confidence``: work out
        whether the model was sure of the last committed token."""
        kv = self._cache.kv
        if choice.plain:
            return self._plain.step(kv, self._pending, confidence=confidence)
        if self._loaded.drafts_only:
            return self._chain.step(kv, self._pending, choice, confidence=confidence)
        return self._lookahead.step(kv, self._pending, choice, confidence=confidence)

    def _learn_from_drafts(self, choice: StepChoice, out: StepOutcome) -> None:
        """Auto's feedback: how far each draft of the step agreed with what the model committed."""
        # a step with drafts had its confidence worked out when they were priced, before this decode
        sure = self._confidence() if choice.drafts else False
        self._auto.observe(choice, out.committed, out.accepted_origin, out.n_accepted, sure)

    def _commit(self, out: StepOutcome, committed: list[int], grow_pool: bool) -> None:
        """The reply grows by ``committed`` (the step's tokens the reply keeps); what the cache lacks of them is
        the next step's to evaluate."""
        self._pending = out.committed[out.n_cached :]
        self._confidence = out.confidence
        self._tokens.extend(committed)
        if self._screen is not None:
            self._screen.extend(committed)
        if grow_pool:
            self._sync_pool(len(committed))
            self._pool_grew = True

    def _learn_costs(self, choice: StepChoice, out: StepOutcome, elapsed: float, auto: bool) -> tuple[int, float]:
        """The threads the step ran with and its price in 1-token steps, before it teaches the live costs.

        Each thread count has its own live costs; a step teaches them only when it ran with the count the governor
        keeps and its threads had their cores (not a trial, not waiting for another program). Auto also hears what
        a drafting step really took (a median of those: whether this reply's drafting steps paid).
        """
        governor = self._costs.governor
        threads = governor.last.threads if governor.last is not None else self._loaded.n_threads
        live = self._costs.live_costs_for(threads)
        cost = live.cost(out.batch_size, out.n_logits)
        if auto:
            taken = live.in_steps(elapsed, out.batch_size, out.n_logits) if choice.drafts else 1.0
            self._auto.observe_cost(choice, len(out.committed), taken)
        if governor.steady:
            live.record(out.batch_size, out.n_logits, elapsed)
        return threads, cost

    def _sync_pool(self, n_new: int) -> None:
        """Add the n-grams of the reply whose continuation just became complete."""
        tokens, pool = self._tokens, self._pool
        n = len(tokens)
        start = min(self._pool_synced, n - n_new)
        for i in range(max(start - pool.max_len - 1, 0), n - pool.max_len - 1):
            pool.add(tokens[i], tokens[i + 1 : i + 1 + pool.max_len], DraftOrigin.REPLY)
        self._pool_synced = n

    def _event(
        self,
        cfg: LookaheadConfig | None,
        choice: StepChoice,
        out: StepOutcome,
        committed: list[int],
        pieces: list[str],
        reason: str | None,
        elapsed: float,
        threads: int,
        cost: float,
    ) -> StepEvent:
        """The step as reported: the prompt's figures on the first one, the stop reason on the last."""
        first = self._n_steps == 0
        governor = self._costs.governor
        # The step's first n_accepted tokens are the draft's, verified; the rest are the model's own.
        n_drafted = min(out.n_accepted, len(committed))
        sources = (out.accepted_origin or DraftOrigin.UNKNOWN,) * n_drafted + (OWN,) * (len(committed) - n_drafted)
        return StepEvent(
            step=self._n_steps,
            mode="plain" if cfg is None else ("auto" if cfg.auto else "lookahead"),
            token_ids=tuple(committed),
            text="".join(pieces),
            token_texts=tuple(pieces),
            token_sources=sources,
            n_committed=len(committed),
            batch_size=out.batch_size,
            n_logits=out.n_logits,
            n_drafted=out.n_drafted,
            n_accepted=out.n_accepted,
            n_reevaluated=out.n_reevaluated,
            window=out.window,
            ngram=out.ngram,
            guesses=out.guesses,
            elapsed_s=elapsed,
            decode_s=out.decode_s,
            prefill_tokens=self._prefill_tokens if first else 0,
            prefill_s=self._prefill_s if first else 0.0,
            prompt_tokens=self._n_prompt if first else 0,
            top2_gaps=tuple(out.top2_gaps[: len(committed)]),
            stop_reason=reason,
            stop_string=(self._reply_end.matched_stop or "") if reason == "stop_string" else "",
            notice=self._notice if first else "",
            choice=choice.reason,
            draft_origin=out.accepted_origin,
            threads=threads,
            max_threads=self._loaded.n_threads,
            kept_threads=governor.threads,
            contended=governor.busy,
            cost=cost,
        )

    def _end(self, reason: str) -> StepEvent:
        """The closing event of a generation stopped between steps: no forward pass, the text's tail."""
        self._finished = True
        return StepEvent(
            step=self._n_steps,
            mode="none",
            token_ids=(),
            text=self._reply_end.finish(),
            n_committed=0,
            batch_size=0,
            n_logits=0,
            n_drafted=0,
            n_accepted=0,
            n_reevaluated=0,
            window=0,
            ngram=0,
            guesses=0,
            elapsed_s=0.0,
            decode_s=0.0,
            stop_reason=reason,
        )


def _open_sampler(model: Model, sampling: SamplingConfig, prompt: list[int]) -> Sampler | None:
    """The sampler chain ``sampling`` asks for (None: plain argmax), its penalties' history begun with the
    prompt's tail."""
    if sampling.plain_argmax:
        return None
    sampler = Sampler(
        model, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
        min_p=sampling.min_p, seed=sampling.seed, repeat_penalty=sampling.repeat_penalty,
        repeat_last_n=sampling.repeat_last_n, dry_multiplier=sampling.dry_multiplier,
        dry_base=sampling.dry_base, dry_allowed_length=sampling.dry_allowed_length)
    if sampling.prompt_tail:
        sampler.accept(prompt[-sampling.prompt_tail :])
    return sampler
