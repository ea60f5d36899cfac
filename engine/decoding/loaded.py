"""A model file loaded for lookahead: the model, one context made for it, its batch, and the model's facts.

``LoadedModel`` is the part of ``Engine`` (runtime.py) that owns the native objects (``close`` frees the context
before its model) and says what this model allows: its context length, the threads the engine may use, whether
its memory is recurrent, and what lookahead it gets.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from engine.costs.cpus import default_threads
from engine.decoding.plan import ALL_SEQS, N_SEQ
from engine.decoding.settings import MAX_GUESSES, MAX_NGRAM, MAX_WINDOW
from engine.library.names import LookaheadKind
from engine.llama.models import ROLLBACK_TOKENS, GgufSummary, check_gguf
from engine.llama.native import Batch, Context, Model, NativeError
from engine.llama.problems import ContextTooLargeError, SettingsError
from engine.llama.ram import check_context_fits

# Largest batch one lookahead step can need: re-evaluated drafts, the input
# token, G candidates of N-1 tokens and a window of W x (N-1).
STEP_BATCH_MAX = (MAX_NGRAM - 1) + 1 + MAX_GUESSES * (MAX_NGRAM - 1) + MAX_WINDOW * (MAX_NGRAM - 1)
PREFILL_BATCH = 512
MIN_N_CTX = 64


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


def _load(
    model_path: str | os.PathLike[str], n_ctx: int, n_threads: int, progress: Callable[[float], bool] | None
) -> tuple[Model, Context]:
    """The model and its context; the model is closed again when the context cannot be made."""
    model = Model(model_path, progress=progress)
    try:
        try:
            return model, open_context(model, n_ctx, n_threads)
        except NativeError as exc:  # almost always a failed allocation
            raise ContextTooLargeError(f"{exc}; try a smaller context size") from exc
    except BaseException:
        model.close()
        raise


class LoadedModel:
    """A model and one context made for lookahead (N_SEQ sequences, unified KV), with its batch and facts."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
        summary: GgufSummary | None = None,
    ) -> None:
        """As ``Engine``'s: refuses a context too small or too big for memory before loading anything."""
        self.summary = summary if summary is not None else check_gguf(model_path)
        self.n_threads = n_threads or default_threads()
        self.threads_chosen = n_threads is None  # the engine's to change while another program holds a core
        if n_ctx < MIN_N_CTX:
            raise SettingsError(f"context size {n_ctx} is too small (at least {MIN_N_CTX})")
        # llama.cpp may abort, or the kernel kill us, on a cache too big for memory.
        check_context_fits(self.summary, n_ctx)
        self.model, self.ctx = _load(model_path, n_ctx, self.n_threads, progress)
        self.info = self.model.info()
        self.n_ctx = self.ctx.n_ctx
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

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
