"""What every user of an engine's llama.cpp state reads of it: context, batch, cache, threads, sequences.

``engine.decoding.runtime.Engine`` has these parts. The cost measurement (calibration.py) and a generation
(engine/decoding/generation.py) each name what more they use in a Protocol built on this one, so that neither
imports the engine that calls it. It lives here, below decoding, because measuring needs it too.
"""

from __future__ import annotations

from typing import Protocol

from engine.costs.contention import ThreadGovernor
from engine.llama.native import Batch, Context


class CacheFill(Protocol):
    """How many positions the cache holds (``engine.decoding.decoders.KvState``)."""

    @property
    def n(self) -> int: ...


class EngineParts(Protocol):
    @property
    def ctx(self) -> Context: ...
    @property
    def batch(self) -> Batch: ...
    @property
    def kv(self) -> CacheFill: ...
    @property
    def governor(self) -> ThreadGovernor: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_threads(self) -> int: ...
    @property
    def drafts_only(self) -> bool: ...  # a hybrid memory: one sequence, one draft a step
    @property
    def rollback(self) -> int: ...  # tokens a recurrent memory can take back (0: an attention cache drops any)
    @property
    def commit_seqs(self) -> tuple[int, ...]: ...  # the sequences a committed token belongs to
