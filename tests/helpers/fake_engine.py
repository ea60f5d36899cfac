"""The fake engine of the comparison tests: scripted replies at set step times, no model loaded.

``ScriptedEngine`` replies with tokens 0, 1, 2, … (the text ``"w0 w1 w2 …"``), each decoder at its own ``Pace``
(tokens a step, seconds a step, price a step), as its ``Script`` says. It loads at once like ``FakeEngine``, so the
real worker and window run on it; ``FakeChatSession`` stands in for the chat session a comparison fits its prompt
with.

The fakes are checked against what they fake: ``ComparedEngine`` names what a comparison uses of the engine
(``engine.speed.comparison.compare_decoders``: ``reset``, ``generate``, ``detokenize``), mypy checks below that the
engine has it with the same ``generate``, argument for argument, and each fake declares it, so a fake that no longer
takes what the engine takes fails mypy rather than a test at run time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from engine import ChatSession, GenerationControls, Message, SamplingConfig, StepEvent, StopConfig
from engine.decoding.grammar import Constraint
from engine.decoding.session import FittedPrompt
from tests.helpers.app_fixtures import FakeEngine

if TYPE_CHECKING:
    from engine.decoding.runtime import Engine
    from engine.llama.models import GgufSummary


class Generate(Protocol):
    """``engine.decoding.runtime.Engine.generate``, argument for argument (as a callable Protocol, whose argument
    names mypy compares too)."""

    def __call__(
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
    ) -> Iterator[StepEvent]: ...


class Generating(Protocol):
    """An engine's ``generate``: what fakes and wrappers of the engine declare, so that mypy checks theirs."""

    @property
    def generate(self) -> Generate: ...


class ComparedEngine(Generating, Protocol):
    """What a comparison uses of the engine: a cold start before each run, the run, the text of its tokens."""

    def reset(self) -> None: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...


class ChatEngine(ComparedEngine, Protocol):
    """A compared engine that also renders a chat as the prompt's tokens (what ``FakeChatSession`` fits with)."""

    def render_chat(self, messages: Sequence[Message], tools: Sequence[Any] = ()) -> list[int]: ...


class ComparedSession(Protocol):
    """What ``app.comparison_jobs`` uses of the chat session: its engine, and the prompt it fits messages into."""

    @property
    def engine(self) -> ComparedEngine: ...
    def fit(self, messages: Sequence[Message], max_tokens: int) -> FittedPrompt: ...


if TYPE_CHECKING:

    def _the_engine_and_the_protocols_agree(engine: Engine, session: ChatSession, generate: Generate) -> None:
        """Never called: mypy checks that the engine and the chat session have what the Protocols name, and that
        ``Generate`` takes every argument ``Engine.generate`` takes, by the same names (it cannot lag behind)."""
        compared: ComparedEngine = engine
        fitted: ComparedSession = session
        as_the_engine = engine.generate
        as_the_engine = generate
        del compared, fitted, as_the_engine


def as_engine(fake: Generating) -> Engine:
    """``fake`` where code typed for the engine takes it (``compare_decoders``, the bench, the server's runner): it
    has what it declares (``ComparedEngine``, ``Generating``), which mypy keeps in step with the engine."""
    return cast("Engine", fake)


def piece(token: int) -> str:
    """A scripted token's text."""
    return f"w{token} "


@dataclass(frozen=True)
class Pace:
    """How one decoder's scripted steps go."""

    per_step: int  # tokens a step
    step_s: float  # each step's measured time
    cost: float = 0.0  # each step's price on the cost curve, in 1-token steps (0.0: not priced)
    busy: bool = False  # another program held a core: one thread fewer than the engine may use (``Script.threads``)
    top2_gap: float | None = None  # each token's gap between the top two logits (None: not recorded)
    rows: int = 0  # each step's batch rows (0: a token a row, every draft landing)


@dataclass
class Script:
    """What a ``ScriptedEngine``'s replies are. Read as each run starts (``step_sleep_s`` at each step), so a test
    may change it while the engine lives."""

    plain: Pace
    lookahead: Pace
    reply_tokens: int | None = None  # tokens a reply has at most (None: ``stop.max_tokens``)
    prefill_s: float = 0.0  # the prompt's evaluation, reported with each run's first step
    drift: tuple[float, ...] = (1.0,)  # run k's step times × drift[k % len(drift)]: the machine's own speed
    diverge_at: int | None = None  # lookahead's token at this index is 100 + index (plain's is the index)
    step_sleep_s: float = 0.0  # real time a step takes, for tests that act while a run is in flight
    threads: int = 0  # the threads the engine may use, on every event (0: not reported)


class ScriptedEngine(FakeEngine, ChatEngine):
    """Replies as its ``script`` says, and keeps what it was asked: the runs' decoders in order, the resets, the
    forward passes over all runs."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
        summary: GgufSummary | None = None,
        *,
        script: Script,
    ) -> None:
        super().__init__(model_path, n_ctx, n_threads, progress, summary)
        self.summary = replace(self.summary, name="Scripted")
        self.script = script
        self.runs: list[str] = []  # "plain" / "lookahead", in the order they ran
        self.resets = 0
        self.steps_run = 0  # forward passes, over all runs
        self.steps_at_stop = -1  # steps_run when a test pressed Stop
        self.corpus = self.kept = None  # no drafts from earlier chats or kept n-grams

    def reset(self) -> None:
        self.resets += 1

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(piece(t) for t in tokens)

    def render_chat(self, messages: Sequence[Message], tools: Sequence[Any] = ()) -> list[int]:
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
        controls = controls or GenerationControls()
        script = self.script
        mode = "plain" if controls.lookahead is None else "lookahead"
        pace = script.plain if mode == "plain" else script.lookahead
        factor = script.drift[len(self.runs) % len(script.drift)]
        self.runs.append(mode)
        n = stop.max_tokens if script.reply_tokens is None else min(script.reply_tokens, stop.max_tokens)
        tokens = list(range(n))
        if mode == "lookahead" and script.diverge_at is not None:
            tokens[script.diverge_at] = 100 + script.diverge_at
        cancel = controls.cancel

        def events() -> Iterator[StepEvent]:
            step = 0
            for i in range(0, n, pace.per_step):
                if cancel.is_set():
                    yield self.event(step, "none", [], 0.0, pace, reason="cancelled")
                    return
                time.sleep(script.step_sleep_s)
                self.steps_run += 1
                yield self.event(step, mode, tokens[i : i + pace.per_step], pace.step_s * factor, pace)
                step += 1
            yield self.event(step, "none", [], 0.0, pace, reason="max_tokens")

        return events()

    def event(
        self, step: int, mode: str, tokens: list[int], elapsed: float, pace: Pace, reason: str | None = None,
    ) -> StepEvent:
        """One step as this engine reports it (``mode`` "none": the closing event, no forward pass)."""
        forward = mode != "none"
        threads = self.script.threads
        running = threads - 1 if pace.busy else threads
        return StepEvent(
            step=step, mode=mode, token_ids=tuple(tokens), text=self.detokenize(tokens), n_committed=len(tokens),
            batch_size=max(pace.rows or len(tokens), 1), n_logits=1, n_drafted=0, n_accepted=0, n_reevaluated=0,
            window=4, ngram=4, guesses=3, elapsed_s=elapsed, decode_s=elapsed,
            prefill_s=self.script.prefill_s if forward and step == 0 else 0.0,
            top2_gaps=tuple(pace.top2_gap for _ in tokens) if pace.top2_gap is not None else (),
            stop_reason=reason, threads=running, max_threads=threads, kept_threads=running,
            contended=pace.busy and forward, cost=pace.cost if forward else 0.0,
        )


class FakeChatSession(ComparedSession):
    """The chat session a comparison fits its prompt with: the engine's rendering of the messages, none left out."""

    def __init__(self, engine: ChatEngine) -> None:
        self._engine = engine

    @property
    def engine(self) -> ChatEngine:
        return self._engine

    def fit(self, messages: Sequence[Message], max_tokens: int) -> FittedPrompt:
        return FittedPrompt(tokens=self.engine.render_chat(messages), dropped=0, history=[])


def fake_chat_session(engine: ChatEngine) -> ChatSession:
    """A ``FakeChatSession`` on ``engine``, where ``app.comparison_jobs`` takes the chat session."""
    return cast(ChatSession, FakeChatSession(engine))
