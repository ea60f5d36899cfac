"""The parts of an engine that measuring drives: the loaded model, its cache and its threads.

``engine.decoding.runtime.Engine`` is made of parts (engine/decoding/loaded.py, prompt_cache.py, and this package's
cost_model.py); measuring (calibration.py, exactness.py) names here what it uses of each, so that it does not
import the engine that calls it. It lives here, below decoding, because measuring needs it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from engine.costs.contention import ThreadGovernor
from engine.llama.models import GgufSummary
from engine.llama.native import Batch, Context, Model


class CacheFill(Protocol):
    """How many positions the cache holds (``engine.decoding.decoders.KvState``)."""

    @property
    def n(self) -> int: ...


class LoadedParts(Protocol):
    """A model loaded with its context and batch, and the facts measuring reads
    (``engine.decoding.loaded.LoadedModel``)."""

    n_threads: int  # every thread the engine may use (tests set it)

    @property
    def model(self) -> Model: ...
    @property
    def summary(self) -> GgufSummary: ...
    @property
    def ctx(self) -> Context: ...
    @property
    def batch(self) -> Batch: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def threads_chosen(self) -> bool: ...  # the engine picked the thread count (it may change it)
    @property
    def drafts_only(self) -> bool: ...  # a hybrid memory: one sequence, one draft a step
    @property
    def rollback(self) -> int: ...  # tokens a recurrent memory can take back (0: an attention cache drops any)
    @property
    def commit_seqs(self) -> tuple[int, ...]: ...  # the sequences a committed token belongs to


class CacheParts(Protocol):
    """The committed tokens in the cache, emptied and read by measuring
    (``engine.decoding.prompt_cache.PromptCache``)."""

    @property
    def kv(self) -> CacheFill: ...

    def reset(self) -> None: ...
    def prefill(
        self,
        tokens: Sequence[int],
        progress: Callable[[int, int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> int: ...
    def cache_kept(self) -> AbstractContextManager[None]: ...


class ThreadParts(Protocol):
    """The threads decodes run with (``engine.costs.cost_model.CostModel``)."""

    threads_agree: bool | None  # a 1-thread step's logits equal an all-thread one's (the probe finds out)

    @property
    def governor(self) -> ThreadGovernor: ...

    def all_threads(self) -> AbstractContextManager[None]: ...


class Measurable(Protocol):
    """What measuring drives: an engine's loaded model, its cache and its threads (``Engine`` has these parts)."""

    @property
    def loaded(self) -> LoadedParts: ...
    @property
    def cache(self) -> CacheParts: ...
    @property
    def costs(self) -> ThreadParts: ...
