"""The engine: a loaded model, its lookahead-ready context, batch and KV cache.

``Engine.generate`` returns an iterator of ``StepEvent``: one per forward pass,
with the tokens it committed and their text. Each call builds a ``Generation``
(generation.py), which holds that reply's decoding state and loop. The KV cache
is kept between generations: what it holds, and how a new prompt evaluates only
what differs from that, is ``PromptCache``'s (prompt_cache.py), which ``Engine``
builds on. Here: loading, Auto's cost curve and the thread governor, drafts from
beyond one reply, the chat's text, and starting a generation.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engine.costs.calibration import (
    QUICK_PROBE_SIZES,
    MeasurementCancelled,
    curve_for,
    measure,
    probe_exact_batch,
    probe_threads_agree,
)
from engine.costs.contention import CpuLoad, DecodeSample, ThreadGovernor
from engine.costs.cpus import default_threads
from engine.costs.curve import DEFAULT_CURVE, CostCurve, LiveCosts, load_cached
from engine.costs.whatif import curve_from_env
from engine.decoding import kept as kept_ngrams
from engine.decoding.auto import AcceptanceStats
from engine.decoding.decoders import KvState
from engine.decoding.drafts import CorpusIndex, DraftCorpus
from engine.decoding.generation import Generation, GenerationControls, StepEvent
from engine.decoding.grammar import Constraint, GrammarState
from engine.decoding.origins import DraftOrigin, DraftSource
from engine.decoding.plan import ALL_SEQS, N_SEQ
from engine.decoding.pool import NgramPool
from engine.decoding.prompt_cache import PromptCache
from engine.decoding.settings import MAX_GUESSES, MAX_NGRAM, MAX_WINDOW, SamplingConfig, StopConfig
from engine.decoding.text import ChatTemplate, Message, built_in_format, render_parts
from engine.library.names import LookaheadKind
from engine.llama.models import ROLLBACK_TOKENS, GgufSummary, check_gguf
from engine.llama.native import Batch, Context, Model, NativeError
from engine.llama.problems import ContextTooLargeError, SettingsError
from engine.llama.ram import check_context_fits

# Largest batch one lookahead step can need: re-evaluated drafts, the input
# token, G candidates of N-1 tokens and a window of W x (N-1).
STEP_BATCH_MAX = (MAX_NGRAM - 1) + 1 + MAX_GUESSES * (MAX_NGRAM - 1) + MAX_WINDOW * (MAX_NGRAM - 1)
PREFILL_BATCH = 512
KEPT_SAVE_INTERVAL_S = 60.0
DEFAULT_N_CTX = 4096


class PromptTooLongError(ValueError):
    """The prompt does not fit the context."""


class LookaheadUnsupportedError(RuntimeError):
    """This model's memory cannot drop speculative entries (recurrent/hybrid)."""


def open_context(model: Model, n_ctx: int, n_threads: int) -> Context:
    """The context the engine decodes in: at most the trained length, a batch that fits any step.

    A model with recurrent memory keeps one state per sequence: it gets one sequence, and ROLLBACK_TOKENS
    states kept back so that a verified draft's rejected tail can be taken back (where llama.cpp can).
    engine/llama/probe.py's child opens the same one, so a file that passes its test load loads here too.
    """
    info = model.info()
    n_ctx = min(n_ctx, info.n_ctx_train) if info.n_ctx_train > 0 else n_ctx
    recurrent = info.recurrent or info.hybrid
    return Context(model, n_ctx=n_ctx, n_batch=max(PREFILL_BATCH, STEP_BATCH_MAX), n_threads=n_threads,
                   n_seq_max=1 if recurrent else N_SEQ, n_rs_seq=ROLLBACK_TOKENS if recurrent else 0)


class Engine(PromptCache):
    """Owns a model and one context made for lookahead (N_SEQ sequences, unified KV); what that cache holds of
    committed tokens is ``PromptCache``'s."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
        summary: GgufSummary | None = None,
    ) -> None:
        """``summary``: this file's ``check_gguf``, when the caller has just made it (else it is made here).

        ``n_threads``: None picks them from this PC's cores (engine/costs/cpus.py) and gives one up while another
        program holds a core (engine/costs/contention.py); a number is kept as given.
        """
        self.summary = summary if summary is not None else check_gguf(model_path)
        self.n_threads = n_threads or default_threads()
        self.threads_chosen = n_threads is None
        if n_ctx < 64:
            raise SettingsError(f"context size {n_ctx} is too small (at least 64)")
        # Before loading anything: llama.cpp may abort, or the kernel kill us, on a cache too big for memory.
        check_context_fits(self.summary, n_ctx)
        # LOOKAHEAD_COST_CURVE pins the curve Auto plans with: no measurement or live step time replaces it.
        self._pinned_curve = curve_from_env()
        self._reference_curve = self._pinned_curve or DEFAULT_CURVE
        self.model = Model(model_path, progress=progress)
        try:
            self.info = self.model.info()
            try:
                self.ctx = open_context(self.model, n_ctx, self.n_threads)
            except NativeError as exc:  # almost always a failed allocation
                raise ContextTooLargeError(f"{exc}; try a smaller context size") from exc
        except BaseException:
            self.model.close()
            raise
        self.n_ctx = self.ctx.n_ctx
        self.kv = KvState()
        # Whether a decode gives the same logits at fewer threads (None: not probed yet). Until it is known
        # to, the governor keeps every thread: a result that depended on the count would change the text.
        self.threads_agree: bool | None = None
        self.governor = ThreadGovernor(self.n_threads, adapt=False, load=CpuLoad.for_this_process())
        self.ctx.on_decode = self._after_decode
        # Recurrent or hybrid memory keeps one state per sequence and cannot share a token among sequences: such
        # a model decodes in seq 0 alone and verifies one draft per step, its rejected tail taken back by the
        # states llama.cpp keeps (``rollback`` tokens at most; 0 where the architecture cannot).
        self.recurrent = self.info.recurrent or self.info.hybrid
        self.rollback = self.ctx.n_rs_seq if self.recurrent else 0
        self.drafts_only = self.recurrent and self.rollback > 0
        self.lookahead_block_reason = self._lookahead_block_reason()
        self.batch = Batch(self.ctx.n_batch, N_SEQ)
        # Committed tokens carry every sequence id so lookahead branches see them.
        self.commit_seqs: tuple[int, ...] = (0,) if self.recurrent else ALL_SEQS
        bos = self.model.token_text(self.model.bos()) if self.model.bos() >= 0 else ""
        eos = self.model.token_text(self.model.eos()) if self.model.eos() >= 0 else ""
        self._control_text_cache: dict[str, bool] = {}
        own = self.model.chat_template()
        self.template = ChatTemplate(own, bos_token=bos, eos_token=eos,
                                     built_in=None if own else built_in_format(self._is_control_token))
        # Auto plans with the reference curve until this machine's is loaded or measured. Its batch
        # cap is a guess until probed: the first lookahead generation runs the quick probe (see generate).
        self.cost_curve: CostCurve = self._reference_curve
        # "default" | "quick-probed" | "probed" | "cached" | "measured" | "what-if" | "pinned"
        self.cost_curve_source = "default"
        self._live: dict[int, LiveCosts] = {}  # per thread count: the curve of that count, corrected as it runs
        self._machine_curves: dict[int, CostCurve] = {}  # per thread count: what the governor prices decodes on
        self._live_learn = self._pinned_curve is None
        self._before_what_if = (self.cost_curve, self.cost_curve_source)  # what plan_with(None) goes back to
        self.acceptance = AcceptanceStats()
        # Drafts from beyond one reply: earlier chats with this model, and the n-grams kept from earlier
        # replies. None until a caller opens them (the app: draft_from_earlier_chats); benchmarks set their own.
        self.corpus: CorpusIndex | None = None
        self.kept: NgramPool | None = None
        # The attached documents of the chat being answered, whole (set_documents); their drafts' origin is
        # DraftOrigin.DOCUMENT.
        self.documents: DraftCorpus | None = None
        self._documents_key: tuple[str, ...] = ()
        self._kept_on_disk = False
        self._kept_changed = False
        self._kept_saved_at = 0.0
        self.keep_replies = True  # merge each reply's n-grams into ``kept`` (benchmarks turn it off)

    @property
    def cost_curve_measured(self) -> bool:
        """True once Auto plans with this machine's own curve (cached or measured now), or the pinned one."""
        return self.cost_curve_source in ("cached", "measured", "pinned")

    def _use_curve(self, curve: CostCurve, source: str) -> None:
        self.cost_curve = curve
        self.cost_curve_source = source
        self._live = {}
        self._machine_curves = {}
        self._live_learn = source != "what-if" and self._pinned_curve is None
        if source == "cached" and self.threads_agree is None:
            self.threads_agree = curve.threads_agree
        if curve.rest_floor is not None:
            self.governor.rest = curve.rest
        self.governor.adapt = bool(self.threads_agree) and self.threads_chosen and self.n_threads > 1

    @property
    def live_costs(self) -> LiveCosts:
        """What Auto prices the next step with: the costs of the thread count it will run on."""
        return self.live_costs_for(self.ctx.n_threads)

    def live_costs_for(self, threads: int) -> LiveCosts:
        live = self._live.get(threads)
        if live is None:
            live = self._live[threads] = LiveCosts(self.cost_curve.for_threads(threads), learn=self._live_learn)
        return live

    def _after_decode(self, batch: Batch, wall: float, cpu: float) -> None:
        """Every decode: tell the governor how it ran, and apply the thread count it asks for."""
        n = batch.n_tokens
        n_logits = int(np.count_nonzero(batch.logits[:n])) if n > 1 else 1
        threads = self.ctx.n_threads
        curve = self._machine_curves.get(threads)
        if curve is None:  # this PC's own, also while Auto plans on another machine's (plan_with)
            own = self._before_what_if[0] if self.cost_curve_source == "what-if" else self.cost_curve
            curve = self._machine_curves[threads] = own.for_threads(threads)
        threads = self.governor.observe(DecodeSample(wall, cpu, threads, curve.cost(n, max(n_logits, 1))))
        if self.governor.adapt and threads != self.ctx.n_threads:  # else the count is the caller's to set
            self.ctx.set_threads(threads)

    @property
    def threads_in_use(self) -> int:
        return self.ctx.n_threads

    @contextlib.contextmanager
    def all_threads(self) -> Iterator[None]:
        """Decode with every thread and no governor inside (measuring, probing); starts afresh after."""
        adapt = self.governor.adapt
        self.governor.adapt = False
        self.ctx.set_threads(self.n_threads)
        try:
            yield
        finally:
            self.governor.reset()
            self.governor.adapt = adapt
            self.ctx.set_threads(self.n_threads)

    def plan_with(self, curve: CostCurve | None) -> None:
        """Let Auto plan with ``curve``, another machine's (engine/costs/whatif.py), as if it ran there.

        Steps stay within the batch size this machine gives exact logits for (probed if unknown),
        and live step times do not correct the curve: they are this machine's, not that one's.
        ``None`` goes back to this machine's curve (the cached one, or the reference until measured).
        """
        if curve is None:
            if self.cost_curve_source == "what-if":
                self._use_curve(*self._before_what_if)
            return
        cap = self.probe_exact_cap()
        if self.cost_curve_source != "what-if":
            self._before_what_if = (self.cost_curve, self.cost_curve_source)
        self._use_curve(replace(curve, max_exact_batch=min(cap, curve.max_exact_batch)), "what-if")

    def probe_exact_cap(self) -> int:
        """Make sure steps stay within batches measured exact for this model: probe quickly if nothing is known.

        Costs a 300-token prompt and two decodes of each of ``QUICK_PROBE_SIZES`` the first time; the cache holds
        what it held before after it.
        """
        if self.cost_curve_source == "default" and not self.load_cached_curve():
            with self.cache_kept():
                cap = probe_exact_batch(self, sizes=QUICK_PROBE_SIZES)
            self._use_curve(replace(self._reference_curve, max_exact_batch=cap), "quick-probed")
        return self.cost_curve.max_exact_batch

    def probe_threads(self, cancel: threading.Event | None = None) -> bool:
        """Find out, if not known yet, whether the thread count may change (one thread gives all threads' logits),
        so that the thread governor works from the first reply, plain decoding's too. A cached curve knows;
        else a short probe (about a second; the cache is kept); ``cancel`` stops it (``MeasurementCancelled``)
        and it stays unknown. True once known."""
        if self.threads_agree is None:
            self.load_cached_curve()
        if self.threads_agree is None:
            with self.cache_kept():
                agree = probe_threads_agree(self, cancel)
            self.threads_agree = agree
            self.governor.adapt = agree and self.threads_chosen and self.n_threads > 1
        return self.threads_agree is not None

    def load_cached_curve(self) -> bool:
        """Use the curve measured before for this model, threads and CPU, if there is one (instant)."""
        if self._pinned_curve is None and not self.cost_curve_measured:
            cached = load_cached(self.summary.path, self.n_threads)
            if cached is not None:
                self._use_curve(cached, "cached")
        return self.cost_curve_measured

    def tune(
        self,
        refresh: bool = False,
        budget_s: float = 6.0,
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> CostCurve:
        """Load (or measure, when missing or ``refresh``) this machine's cost curve for Auto.

        Measuring takes a few seconds; the cache holds what it held before after it. ``progress`` hears
        0..1; setting ``cancel`` stops it with ``MeasurementCancelled`` (Auto then
        keeps planning with the reference curve, capped by the exact-batch probe
        when that had finished). With a pinned curve (``LOOKAHEAD_COST_CURVE``)
        only the exact-batch probe runs: which batches are exact is this model's
        and CPU's, whatever the costs are taken to be.
        """
        with self.cache_kept():
            return self._tune(refresh, budget_s, progress, cancel)

    def _tune(
        self,
        refresh: bool,
        budget_s: float,
        progress: Callable[[float], None] | None,
        cancel: threading.Event | None,
    ) -> CostCurve:
        probed = self.cost_curve.max_exact_batch if self.cost_curve_source == "probed" else None
        pinned = self._pinned_curve
        try:
            if pinned is not None:
                if self.cost_curve_source == "pinned" and not refresh:
                    return self.cost_curve
                curve = measure(self, progress=progress, cancel=cancel, max_exact_batch=probed, pinned=pinned)
                source = "pinned"
            else:
                curve, measured = curve_for(
                    self, refresh=refresh, budget_s=budget_s, progress=progress, cancel=cancel, max_exact_batch=probed
                )
                source = "measured" if measured else "cached"
        except MeasurementCancelled as exc:
            if exc.max_exact_batch is not None and not self.cost_curve_measured:
                self._use_curve(replace(self._reference_curve, max_exact_batch=exc.max_exact_batch), "probed")
            raise
        self._use_curve(curve, source)
        return self.cost_curve

    def _lookahead_block_reason(self) -> str | None:
        if self.recurrent and not self.rollback:
            kind = "recurrent" if self.info.recurrent else "hybrid"
            return (
                f"lookahead is unavailable for this model: llama.cpp cannot take back rejected guesses from the "
                f"{kind} memory of its architecture ({self.summary.architecture}); plain decoding still works"
            )
        return None

    @property
    def lookahead_kind(self) -> LookaheadKind:
        """What lookahead this model gets."""
        if self.lookahead_block_reason:
            return LookaheadKind.PLAIN
        return LookaheadKind.DRAFTS_ONLY if self.drafts_only else LookaheadKind.FULL

    def draft_from_earlier_chats(self) -> None:
        """Draft from earlier chats (fed by ``remember_chat``) and from the n-grams kept on disk for this file."""
        if self.corpus is None:
            self.corpus = CorpusIndex()
        if not self._kept_on_disk:
            self.kept = kept_ngrams.load(self.summary.path)
            self._kept_on_disk = True

    def remember_chat(self, tokens: Sequence[int]) -> None:
        """Add a chat's text (token ids, its messages in order) to the drafts from earlier chats."""
        if self.corpus is not None:
            self.corpus.add(tokens)

    def set_documents(self, texts: Sequence[str]) -> None:
        """Draft from these documents' whole text (the parts not in the prompt too) until set again.

        Setting the same texts again keeps the index (a chat's next turn); ``[]`` drops it.
        """
        key = tuple(texts)
        if key == self._documents_key:
            return
        self._documents_key = key
        if not texts:
            self.documents = None
            return
        index = CorpusIndex(max_tokens=1_000_000, source=DraftSource.DOCUMENT, origin=DraftOrigin.DOCUMENT)
        for text in texts:  # a document's "<|im_end|>" is text, not a control token
            index.add(self.model.tokenize(text, add_special=False, parse_special=False))
        self.documents = index

    def keep_ngrams(self, pool: NgramPool) -> None:
        """Merge a finished reply's n-grams into the kept pool (when there is one)."""
        if self.kept is not None and self.keep_replies:
            kept_ngrams.keep(self.kept, pool)
            self._kept_changed = True

    def save_kept_ngrams(self, force: bool = False) -> None:
        """Write the kept n-grams to disk if they came from there and changed: at most once a minute
        (a full pool takes a quarter of a second to write) unless ``force``."""
        if not (self._kept_on_disk and self._kept_changed and self.kept is not None):
            return
        if force or time.monotonic() - self._kept_saved_at >= KEPT_SAVE_INTERVAL_S:
            kept_ngrams.save(self.summary.path, self.kept)
            self._kept_changed = False
            self._kept_saved_at = time.monotonic()

    def close(self) -> None:
        self.save_kept_ngrams(force=True)
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- text ---

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def render_chat(self, messages: Sequence[Message], tools: Sequence[Any] = ()) -> list[int]:
        """The chat as the model reads it: the template's markers as control tokens, what people wrote as text.

        A message that holds the text of a control token ("<|im_end|>" in a question about chat templates, or
        in an attached file) is tokenized apart from the template, as plain text, so it cannot end a turn or
        start another role's. ``tools``: the tools offered (OpenAI's function tools), for a template that
        takes them.
        """
        literal = {i for i, m in enumerate(messages) if self._reads_as_control(m.content)}
        parts = render_parts(self.template, messages, literal, tools=tools) if literal else None
        if parts is None:
            parts = [(self.template.render(messages, add_generation_prompt=True, tools=tools), False)]
        # The template writes the BOS token itself when the model wants one.
        bos = self.template.bos_token
        first, first_literal = parts[0]
        add_special = self.model.add_bos() and not (bos and first.startswith(bos) and not first_literal)
        tokens: list[int] = []
        for k, (text, is_literal) in enumerate(parts):
            tokens += self.model.tokenize(text, add_special=add_special and k == 0, parse_special=not is_literal)
        return tokens

    def _is_control_token(self, text: str) -> bool:
        """``text`` is one of the vocabulary's control tokens (a turn marker, say), not text that spells it."""
        return len(self.model.tokenize(text, parse_special=True)) == 1 and self._reads_as_control(text)

    def _reads_as_control(self, text: str) -> bool:
        """``text`` would turn into control tokens if tokenized with the template's markers."""
        known = self._control_text_cache.get(text)
        if known is None:
            known = self.model.tokenize(text, parse_special=True) != self.model.tokenize(text, parse_special=False)
            if len(self._control_text_cache) >= 512:
                self._control_text_cache.clear()
            self._control_text_cache[text] = known
        return known

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.model.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # --- generation ---

    def generate(
        self,
        prompt: Sequence[int],
        controls: GenerationControls | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        stop: StopConfig = StopConfig(),
        history: Sequence[int] = (),
        notice: str = "",
        record_gaps: bool = False,
        exact_only: bool = True,
        constraint: Constraint | None = None,
    ) -> Iterator[StepEvent]:
        """Generate from ``prompt`` (token ids): one event per forward pass of a ``Generation``.

        ``history`` adds tokens to the lookahead pool besides the prompt (earlier
        turns of a chat). Settings in ``controls`` may change between steps.
        ``constraint``: a grammar every token of the reply must follow (GrammarError if it cannot be used).
        ``exact_only`` keeps every step within the batch size measured to give
        bit-identical logits (turn off only to reproduce oversized reference shapes).
        """
        controls = controls or GenerationControls()
        sampling.validate()
        stop.validate()
        if controls.lookahead is not None:
            controls.lookahead.validate()
            if self.lookahead_block_reason:
                raise LookaheadUnsupportedError(self.lookahead_block_reason)
            # Never measures here (that is for idle time, see tune); the exact-batch cap must be known.
            self.probe_exact_cap()
        if not prompt:
            raise PromptTooLongError("the prompt is empty")
        if len(prompt) + 1 > self.n_ctx:
            raise PromptTooLongError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx}; "
                "shorten it or raise the context size"
            )
        # A grammar that cannot be used is refused here, before the prompt is read.
        grammar = GrammarState(self.model, constraint) if constraint is not None else None
        return _events(
            functools.partial(
                Generation, self, list(prompt), controls, sampling, stop, list(history), notice, record_gaps,
                exact_only, grammar,
            )
        )


def _events(start: Callable[[], Generation]) -> Iterator[StepEvent]:
    """The events of the generation ``start`` builds; a generator, so nothing (prefill, sampler) happens
    before the first event is asked for, and the generation is closed however the caller stops."""
    generation = start()
    try:
        while (event := generation.step()) is not None:
            yield event
    finally:
        generation.close()
