"""The engine: a loaded model and the parts that decode with it, one job each.

``Engine.generate`` returns an iterator of ``StepEvent``: one per forward pass,
with the tokens it committed and their text. Each call builds a ``Generation``
(generation.py), which holds that reply's decoding state and loop. The engine
holds what lasts across replies, in parts:

    loaded    the model, its context and batch, and the model's facts   (loaded.py)
    cache     what the KV cache holds of committed tokens               (prompt_cache.py)
    costs     Auto's cost curve, measuring it, the thread governor      (engine/costs/cost_model.py)
    drafts    earlier chats, kept n-grams, attached documents           (draft_store.py)
    text      the chat template, tokenizing and detokenizing           (text.py)

``Engine`` itself only assembles them and starts generations; the methods and attributes it forwards to its
parts are the names the app, the command line and the server call it by.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from engine.costs.contention import ThreadGovernor
from engine.costs.cost_model import CostModel
from engine.costs.cpus import default_threads as default_threads  # opening.py picks the threads it test-loads with
from engine.costs.curve import CostCurve
from engine.costs.whatif import curve_from_env
from engine.decoding.acceptance import AcceptanceStats
from engine.decoding.decoders import KvState
from engine.decoding.draft_store import DraftStore
from engine.decoding.drafts import CorpusIndex, DraftCorpus
from engine.decoding.generation import Generation, GenerationControls, StepEvent
from engine.decoding.grammar import Constraint, GrammarState
from engine.decoding.loaded import LoadedModel
from engine.decoding.pool import NgramPool
from engine.decoding.prompt_cache import PromptCache
from engine.decoding.settings import SamplingConfig, StopConfig
from engine.decoding.text import ChatTemplate, ChatText, Message
from engine.library.names import LookaheadKind
from engine.llama.models import GgufSummary
from engine.llama.native import Context, Model, ModelInfo

DEFAULT_N_CTX = 4096

T = TypeVar("T")


class PromptTooLongError(ValueError):
    """The prompt does not fit the context."""


class LookaheadUnsupportedError(RuntimeError):
    """This model's memory cannot drop speculative entries (recurrent/hybrid)."""


class _Forward(Generic[T]):
    """An attribute of one of the engine's parts, read and set through the engine (under its own name in the part
    unless ``name`` says another)."""

    def __init__(self, part: str, name: str = "") -> None:
        self._part = part
        self._name = name

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = self._name or name

    @overload
    def __get__(self, engine: None, owner: type) -> _Forward[T]: ...
    @overload
    def __get__(self, engine: object, owner: type) -> T: ...
    def __get__(self, engine: object | None, owner: type) -> T | _Forward[T]:
        if engine is None:
            return self
        value: T = getattr(getattr(engine, self._part), self._name)
        return value

    def __set__(self, engine: object, value: T) -> None:
        setattr(getattr(engine, self._part), self._name, value)


class Engine:
    """A model loaded for lookahead, and the parts that decode with it (see the module's docstring)."""

    # The model's facts (LoadedModel's).
    summary = _Forward[GgufSummary]("loaded")
    info = _Forward[ModelInfo]("loaded")
    model = _Forward[Model]("loaded")
    ctx = _Forward[Context]("loaded")
    n_ctx = _Forward[int]("loaded")
    n_threads = _Forward[int]("loaded")
    drafts_only = _Forward[bool]("loaded")
    rollback = _Forward[int]("loaded")
    lookahead_block_reason = _Forward[str | None]("loaded")
    lookahead_kind = _Forward[LookaheadKind]("loaded")
    kv = _Forward[KvState]("cache")
    template = _Forward[ChatTemplate]("text")
    # What steps cost and the threads they run with (CostModel's).
    governor = _Forward[ThreadGovernor]("costs")
    threads_in_use = _Forward[int]("costs")
    cost_curve = _Forward[CostCurve]("costs", "curve")
    # What drafts come from beyond one reply (DraftStore's); benchmarks and tests set them.
    corpus = _Forward[CorpusIndex | None]("drafts")
    kept = _Forward[NgramPool | None]("drafts")
    documents = _Forward[DraftCorpus | None]("drafts")
    keep_replies = _Forward[bool]("drafts")

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
        pinned = curve_from_env()  # a LOOKAHEAD_COST_CURVE that names no curve is refused before loading
        self.loaded = LoadedModel(model_path, n_ctx, n_threads, progress, summary)
        self.cache = PromptCache(self.loaded)
        self.costs = CostModel(self.loaded, self.cache, pinned)
        self.text = ChatText(self.loaded.model)
        self.drafts = DraftStore(self.loaded.summary.path, self.text.tokenize_as_text)
        self.acceptance = AcceptanceStats()  # how often Auto's drafts land, learned across replies

    def close(self) -> None:
        self.drafts.save_kept_ngrams(force=True)
        self.loaded.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the parts' methods, under the names callers use ---

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.text.tokenize(text, add_special)

    def render_chat(self, messages: Sequence[Message], tools: Sequence[Any] = ()) -> list[int]:
        """``ChatText.render_chat``: the chat as the model reads it."""
        return self.text.render_chat(messages, tools)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.text.detokenize(tokens)

    def reset(self) -> None:
        """Forget the cache (the next prompt is evaluated from scratch)."""
        self.cache.reset()

    def read_ahead(self, tokens: Sequence[int], cancel: threading.Event | None = None) -> int:
        """``PromptCache.read_ahead``: read the start of a prompt not sent yet."""
        return self.cache.read_ahead(tokens, cancel)

    def cache_positions(self) -> dict[int, tuple[int, int]]:
        return self.cache.cache_positions()

    def tune(
        self,
        refresh: bool = False,
        budget_s: float = 6.0,
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> CostCurve:
        """``CostModel.tune``: load or measure this machine's cost curve for Auto."""
        return self.costs.tune(refresh, budget_s, progress, cancel)

    def load_cached_curve(self) -> bool:
        return self.costs.load_cached_curve()

    def probe_threads(self, cancel: threading.Event | None = None) -> bool:
        return self.costs.probe_threads(cancel)

    def probe_exact_cap(self) -> int:
        return self.costs.probe_exact_cap()

    def plan_with(self, curve: CostCurve | None) -> None:
        """``CostModel.plan_with``: let Auto plan with another machine's curve (None: this machine's again)."""
        self.costs.plan_with(curve)

    def draft_from_earlier_chats(self) -> None:
        self.drafts.draft_from_earlier_chats()

    def remember_chat(self, tokens: Sequence[int]) -> None:
        self.drafts.remember_chat(tokens)

    def set_documents(self, texts: Sequence[str]) -> None:
        self.drafts.set_documents(texts)

    def save_kept_ngrams(self, force: bool = False) -> None:
        self.drafts.save_kept_ngrams(force)

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
            if self.loaded.lookahead_block_reason:
                raise LookaheadUnsupportedError(self.loaded.lookahead_block_reason)
            # Never measures here (that is for idle time, see tune); the exact-batch cap must be known.
            self.costs.probe_exact_cap()
        if not prompt:
            raise PromptTooLongError("the prompt is empty")
        n_ctx = self.loaded.n_ctx
        if len(prompt) + 1 > n_ctx:
            raise PromptTooLongError(
                f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}; "
                "shorten it or raise the context size"
            )
        # A grammar that cannot be used is refused here, before the prompt is read.
        grammar = GrammarState(self.loaded.model, constraint, stop.max_tokens) if constraint is not None else None
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
