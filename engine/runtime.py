"""The engine: a loaded model, its lookahead-ready context, and the generation loop.

A generation is an iterator of ``StepEvent``: one per forward pass, with the
tokens it committed and their text. The KV cache is kept between generations;
a new prompt evaluates only what differs from what the cache already holds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from .auto import AcceptanceStats, AutoPolicy, FixedPolicy, StepChoice
from .costmodel import DEFAULT_CURVE, CostCurve, LiveCosts, curve_for
from .decoders import JacobiWindow, KvState, LookaheadDecoder, PlainDecoder, TokenDrawer
from .drafts import HistoryIndex
from .models import ContextTooLargeError, check_context_fits, check_gguf
from .native import Batch, Context, Model, NativeError, Sampler
from .plan import ALL_SEQS
from .pool import NgramPool
from .settings import (
    MAX_GUESSES,
    MAX_NGRAM,
    MAX_WINDOW,
    LookaheadConfig,
    SamplingConfig,
    SettingsError,
    StopConfig,
)
from .text import ChatTemplate, Message, StopMatcher, TextStream

# Largest batch one lookahead step can need: re-evaluated drafts, the input
# token, G candidates of N-1 tokens and a window of W x (N-1).
STEP_BATCH_MAX = (MAX_NGRAM - 1) + 1 + MAX_GUESSES * (MAX_NGRAM - 1) + MAX_WINDOW * (MAX_NGRAM - 1)
PREFILL_BATCH = 512
DEFAULT_N_CTX = 4096


class PromptTooLongError(ValueError):
    """The prompt does not fit the context."""


class LookaheadUnsupportedError(RuntimeError):
    """This model's memory cannot drop speculative entries (recurrent/hybrid)."""


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
    prefill_tokens: int = 0  # prompt tokens evaluated before this step (first step only)
    prefill_s: float = 0.0
    top2_gaps: tuple[float, ...] = ()
    stop_reason: str | None = None  # set on the last event
    notice: str = ""  # e.g. context policy applied
    choice: str = ""  # why the step had this shape (Auto explains itself here)


@dataclass
class GenerationControls:
    """Settings a caller may change while a generation runs; read before every step."""

    lookahead: LookaheadConfig | None = None  # None = plain decoding
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class GenerationSummary:
    """Totals of a generation, built from its events."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    steps: int = 0
    elapsed_s: float = 0.0
    prefill_s: float = 0.0
    first_token_s: float | None = None
    stop_reason: str | None = None
    n_drafted: int = 0
    n_accepted: int = 0
    top2_gaps: list[float] = field(default_factory=list)
    per_step: list[int] = field(default_factory=list)

    def observe(self, ev: StepEvent) -> None:
        self.token_ids.extend(ev.token_ids)
        self.text += ev.text
        if ev.mode != "none":  # the closing event of a stopped generation is not a forward pass
            self.steps += 1
            self.per_step.append(ev.n_committed)
        self.elapsed_s += ev.elapsed_s + ev.prefill_s
        self.prefill_s += ev.prefill_s
        if self.first_token_s is None and ev.token_ids:
            self.first_token_s = self.elapsed_s
        self.n_drafted += ev.n_drafted
        self.n_accepted += ev.n_accepted
        self.top2_gaps.extend(ev.top2_gaps)
        if ev.stop_reason:
            self.stop_reason = ev.stop_reason

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_step(self) -> float:
        return self.n_tokens / self.steps if self.steps else 0.0

    @property
    def decode_s(self) -> float:
        return self.elapsed_s - self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


class Engine:
    """Owns a model and one context made for lookahead (N_SEQ sequences, unified KV)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
    ) -> None:
        self.summary = check_gguf(model_path)
        self.n_threads = n_threads or default_threads()
        if n_ctx < 64:
            raise SettingsError(f"context size {n_ctx} is too small (at least 64)")
        # Before loading anything: llama.cpp may abort, or the kernel kill us, on a cache too big for memory.
        check_context_fits(self.summary, n_ctx)
        self.model = Model(model_path, progress=progress)
        try:
            self.info = self.model.info()
            n_ctx = min(n_ctx, self.info.n_ctx_train) if self.info.n_ctx_train > 0 else n_ctx
            try:
                self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=max(PREFILL_BATCH, STEP_BATCH_MAX), n_threads=self.n_threads)
            except NativeError as exc:  # almost always a failed allocation
                raise ContextTooLargeError(f"{exc}; try a smaller context size") from exc
        except BaseException:
            self.model.close()
            raise
        self.n_ctx = self.ctx.n_ctx
        self.kv = KvState()
        self.lookahead_block_reason = self._lookahead_block_reason()
        self.batch = Batch(self.ctx.n_batch)
        # Committed tokens carry every sequence id so lookahead branches see them;
        # recurrent/hybrid memory keeps one state per sequence and cannot share a
        # token among them, so those models (plain decoding only) use seq 0 alone.
        self.commit_seqs: tuple[int, ...] = ALL_SEQS if self.lookahead_block_reason is None else (0,)
        bos = self.model.token_text(self.model.bos()) if self.model.bos() >= 0 else ""
        eos = self.model.token_text(self.model.eos()) if self.model.eos() >= 0 else ""
        self.template = ChatTemplate(self.model.chat_template(), bos_token=bos, eos_token=eos)
        self.cost_curve: CostCurve = DEFAULT_CURVE
        self.cost_curve_measured = False
        self.live_costs = LiveCosts(self.cost_curve)
        self.acceptance = AcceptanceStats()

    def tune(self, refresh: bool = False, budget_s: float = 6.0) -> CostCurve:
        """Load (or measure, when missing or ``refresh``) this machine's cost curve for Auto.

        Measuring takes a few seconds and empties the cache.
        """
        self.cost_curve, measured = curve_for(self, refresh=refresh, budget_s=budget_s)
        self.cost_curve_measured = True
        self.live_costs = LiveCosts(self.cost_curve)
        if measured:
            self.kv = KvState()
        return self.cost_curve

    def _lookahead_block_reason(self) -> str | None:
        if self.info.recurrent or self.info.hybrid:
            kind = "recurrent" if self.info.recurrent else "hybrid"
            return (
                f"lookahead is unavailable for this model: its {kind} memory cannot drop "
                "rejected guesses from the cache; plain decoding still works"
            )
        return None

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- text ---

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def render_chat(self, messages: Sequence[Message]) -> list[int]:
        text = self.template.render(messages, add_generation_prompt=True)
        # The template writes the BOS token itself when the model wants one.
        add_special = self.model.add_bos() and not (self.template.bos_token and text.startswith(self.template.bos_token))
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.model.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # --- cache ---

    def reset(self) -> None:
        """Forget the cache (the next prompt is evaluated from scratch)."""
        self.ctx.clear()
        self.kv = KvState()

    def _reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``prompt[:-1]``; drop the rest of the cache."""
        cached = self.kv.tokens
        limit = min(len(cached), len(prompt) - 1)
        n = 0
        while n < limit and cached[n] == prompt[n]:
            n += 1
        if n < len(cached) and self.lookahead_block_reason is not None:
            self.reset()  # a recurrent state cannot be rewound to an earlier position: start over
            return 0
        if n < len(cached):
            # Truncating the tail keeps the cache in position order (no holes before it).
            self.ctx.seq_rm(-1, n, -1)
            del self.kv.tokens[n:]
        return n

    def _prefill(self, tokens: Sequence[int]) -> None:
        for i in range(0, len(tokens), self.ctx.n_batch):
            chunk = tokens[i : i + self.ctx.n_batch]
            self.batch.set_single_seq(chunk, self.kv.n, self.commit_seqs, last_logits=False)
            self.ctx.decode(self.batch)
            self.kv.tokens.extend(chunk)

    def cache_positions(self) -> dict[int, tuple[int, int]]:
        """(min, max) position held by every sequence; for checking the cache discipline."""
        return {s: (self.ctx.seq_pos_min(s), self.ctx.seq_pos_max(s)) for s in self.commit_seqs}

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
    ) -> Iterator[StepEvent]:
        """Generate from ``prompt`` (token ids). One event per forward pass.

        ``history`` adds tokens to the lookahead pool besides the prompt (earlier
        turns of a chat). Settings in ``controls`` may change between steps.
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
            if controls.lookahead.auto and not self.cost_curve_measured:
                self.tune()
        if not prompt:
            raise PromptTooLongError("the prompt is empty")
        if len(prompt) + 1 > self.n_ctx:
            raise PromptTooLongError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx}; shorten it or raise the context size"
            )
        return self._run(list(prompt), controls, sampling, stop, list(history), notice, record_gaps, exact_only)

    def _run(
        self,
        prompt: list[int],
        controls: GenerationControls,
        sampling: SamplingConfig,
        stop: StopConfig,
        history: list[int],
        notice: str,
        record_gaps: bool,
        exact_only: bool,
    ) -> Iterator[StepEvent]:
        t0 = time.perf_counter()
        reused = self._reuse_prefix(prompt)
        self._prefill(prompt[reused:-1])
        prefill_tokens = len(prompt) - 1 - reused
        prefill_s = time.perf_counter() - t0

        sampler = None
        if not sampling.greedy:
            sampler = Sampler(sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seed)
        try:
            drawer = TokenDrawer(self.ctx, sampler)
            plain = PlainDecoder(self.ctx, self.batch, drawer, self.commit_seqs, record_gaps=record_gaps)
            pool = NgramPool(max_len=MAX_NGRAM - 1)
            pool.add_tokens(history)
            pool.add_tokens(prompt)
            index = HistoryIndex()
            index.extend(history)
            index.extend(prompt)
            lookahead = LookaheadDecoder(self.ctx, self.batch, drawer, pool, JacobiWindow(prompt))
            fixed = FixedPolicy(index, pool)
            auto = AutoPolicy(index, pool, self.live_costs, self.acceptance)

            out_text = _TextOut(TextStream(self.model.token_bytes), StopMatcher(stop.stop_strings), self.model.is_eog)
            history_tokens = list(prompt)
            pool_synced = len(history_tokens)
            generated = 0
            pending = [prompt[-1]]
            step = 0
            while True:
                if controls.cancel.is_set():
                    yield self._final_event(step, "cancelled", out_text.finish())
                    return
                budget = min(self.ctx.n_batch, self.n_ctx - self.kv.n)
                if budget < len(pending) + 1:
                    yield self._final_event(step, "context_full", out_text.finish())
                    return
                cfg = controls.lookahead
                ts = time.perf_counter()
                # Steps stay within the batch size whose logits match a lone decode's.
                cap = max(self.cost_curve.max_exact_batch, 2) if exact_only else budget
                room = min(budget, cap) - len(pending)
                if cfg is None or room < 1:
                    choice = StepChoice(reason="plain")
                else:
                    indexed = len(index) - len(history)  # the index holds the history, then these
                    if indexed < len(history_tokens):  # catch up after plain steps
                        index.extend(history_tokens[indexed:])
                    policy = auto if cfg.auto else fixed
                    choice = policy.choose(pending[-1], cfg, room)
                if choice.plain:
                    out = plain.step(self.kv, pending)
                else:
                    out = lookahead.step(self.kv, pending, choice)
                if cfg is not None and cfg.auto:
                    auto.observe(choice, out.n_accepted)
                pending = out.committed[out.n_cached :]
                committed, reason = self._apply_limits(out.committed, generated, stop.max_tokens)
                generated += len(committed)
                history_tokens.extend(committed)
                if cfg is not None:
                    # n-grams of the reply whose continuation just became complete
                    n_hist = len(history_tokens)
                    start = min(pool_synced, n_hist - len(committed))
                    for i in range(max(start - pool.max_len - 1, 0), n_hist - pool.max_len - 1):
                        pool.add(history_tokens[i], history_tokens[i + 1 : i + 1 + pool.max_len])
                    pool_synced = n_hist
                delta, hit = out_text.feed(committed)
                if hit:
                    reason = "stop_string"
                elif reason:
                    delta += out_text.finish()
                elapsed = time.perf_counter() - ts
                # Wall time, not just llama_decode's: a lookahead step's planning and
                # cache clean-up are part of what it costs.
                self.live_costs.record(out.batch_size, out.n_logits, elapsed)
                yield StepEvent(
                    step=step,
                    mode="plain" if cfg is None else ("auto" if cfg.auto else "lookahead"),
                    token_ids=tuple(committed),
                    text=delta,
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
                    prefill_tokens=prefill_tokens if step == 0 else 0,
                    prefill_s=prefill_s if step == 0 else 0.0,
                    top2_gaps=tuple(out.top2_gaps[: len(committed)]),
                    stop_reason=reason,
                    notice=notice if step == 0 else "",
                    choice=choice.reason,
                )
                if reason:
                    return
                step += 1
        finally:
            if sampler is not None:
                sampler.close()

    def _apply_limits(self, committed: list[int], n_generated: int, max_tokens: int) -> tuple[list[int], str | None]:
        out: list[int] = []
        for tok in committed:
            out.append(tok)
            if self.model.is_eog(tok):
                return out, "eog"
            if n_generated + len(out) >= max_tokens:
                return out, "max_tokens"
        return out, None

    @staticmethod
    def _final_event(step: int, reason: str, tail: str) -> StepEvent:
        return StepEvent(
            step=step,
            mode="none",
            token_ids=(),
            text=tail,
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


class _TextOut:
    """Committed tokens to shown text: UTF-8 safe, end-of-generation tokens hidden, stop strings cut."""

    def __init__(self, stream: TextStream, stops: StopMatcher, is_eog: Callable[[int], bool]) -> None:
        self._stream = stream
        self._stops = stops
        self._is_eog = is_eog

    def feed(self, tokens: Sequence[int]) -> tuple[str, bool]:
        delta = ""
        for tok in tokens:
            if self._is_eog(tok):
                continue
            piece, hit = self._stops.push(self._stream.feed(tok))
            delta += piece
            if hit:
                return delta, True
        return delta, False

    def finish(self) -> str:
        piece, _ = self._stops.push(self._stream.flush())
        return piece + self._stops.flush()
