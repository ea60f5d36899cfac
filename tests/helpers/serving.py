"""A model server of its own for a test: on a free port, stopped and its engine's runner ended whatever happens;
and ``OneWordEngine``, which stands in for the model where a test is about the server, not about what it writes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from engine import GenerationControls, SamplingConfig, StepEvent, StopConfig
from engine.decoding.grammar import Constraint
from engine.decoding.text import Message
from engine.server import EngineRunner, ServerConfig
from engine.server.api import ModelServer
from tests.helpers.fake_engine import Generating

if TYPE_CHECKING:
    from engine.decoding.runtime import Engine

HOLD_S = 120  # the longest a held generation waits for its test (a failed test lets it go at once)


@contextmanager
def serving(engine: Engine, model_id: str, **config: Any) -> Iterator[ModelServer]:
    """``engine`` served as ``model_id`` with ``config`` (ServerConfig's fields; port 0 unless given)."""
    runner = EngineRunner(engine)
    try:
        server = ModelServer(runner, model_id, ServerConfig(**{"port": 0, **config}))
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        runner.close()


class OneWordEngine(Generating):
    """Stands in for the model: any prompt is three tokens, a generation one step that says "Hi". While ``hold``
    is set, a generation waits after its step until it is cancelled."""

    n_ctx = 4096
    lookahead_block_reason = ""

    def __init__(self) -> None:
        self.hold = False

    def render_chat(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        return [1, 2, 3]

    def tokenize(self, text: str) -> list[int]:
        return [1, 2, 3]

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
        yield StepEvent(step=0, mode="plain", token_ids=(7,), text="Hi", n_committed=1, batch_size=1, n_logits=1,
                        n_drafted=0, n_accepted=0, n_reevaluated=0, window=4, ngram=4, guesses=3, elapsed_s=0.01,
                        decode_s=0.01, prompt_tokens=len(prompt), stop_reason=None if self.hold else "eog")
        if self.hold and controls is not None:
            controls.cancel.wait(HOLD_S)
