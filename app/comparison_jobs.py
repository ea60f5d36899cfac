"""The worker's jobs for the Compare tab and the speed report: plain against lookahead on the user's prompt.

No Qt here: app/widgets/comparison_routing.py brings the requests from the tab
and the dialog. ``run_comparison`` and ``run_speed_report`` run on the worker
thread (it owns the engine) and measure with ``engine.speed.comparison``, as
``engine bench`` does: the same A-B-B-A pairs, the same median runs and ratio,
the same ``Verdict``. What is the app's: the chat's context, system prompt and
sampling, attached files and the replay clock of the panes. The report's
tables are engine/speed/tables.py, as the bench's are.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine import ChatSession, LookaheadConfig, Message, SamplingConfig, StepEvent, StopConfig
from engine.decoding.attaching import attach_documents
from engine.documents import read_document
from engine.speed.comparison import CompareProgress, Comparison, compare_decoders, prompt_result
from engine.speed.rows import PromptResult
from engine.speed.workloads import Workload

FAIRNESS_NOTE = (
    "Runs one after the other in A-B-B-A turns, repeated until their ratio settles, so the two never compete "
    "for the CPU; each pane replays its decoder's median run at measured speed."
)


@dataclass(frozen=True)
class CompareRequest:
    """One prompt to run through both decoders, with the chat's context and sampling."""

    request_id: int
    messages: tuple[Message, ...]  # system prompt (if any) + the user's message
    lookahead: LookaheadConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    plain_first: bool = True


@dataclass(frozen=True)
class CompareResult(Comparison):
    """A comparison the Compare tab asked for (``request_id``): every pair, the median runs, the verdict."""

    request_id: int = 0


def run_comparison(
    session: ChatSession,
    request: CompareRequest,
    cancel: threading.Event,
    on_progress: Callable[[CompareProgress], None] | None = None,
) -> CompareResult:
    """The chat's messages, fitted to the context, through ``engine.speed.comparison.compare_decoders``.

    Call on the engine's thread; setting ``cancel`` ends the run in flight at its next step. The engine's
    cache is empty afterwards: the chat's next turn does not reuse the comparison's reply.
    """
    fitted = session.fit(list(request.messages), request.stop.max_tokens)
    comparison = compare_decoders(
        session.engine,
        fitted.tokens,
        request.lookahead,
        sampling=request.sampling,
        stop=request.stop,
        history=fitted.history,
        plain_first=request.plain_first,
        cancel=cancel,
        on_progress=on_progress,
        request_id=request.request_id,
    )
    return CompareResult(**vars(comparison), request_id=request.request_id)


class ReplayTrack:
    """One run's steps on its own clock: which of them had happened ``t`` seconds into its decoding.

    Step ``i`` is shown once the clock passes the end of its measured time.
    The clock counts decoding only, as the speedup does: the prompt's
    evaluation is the same work for both decoders and the panes quote it
    apart, so a pane's clock stops at the time the verdict quotes.
    """

    def __init__(self, events: Sequence[StepEvent]) -> None:
        self.events = list(events)
        self.ends: list[float] = []
        t = 0.0
        for ev in self.events:
            t += ev.elapsed_s
            self.ends.append(t)

    @property
    def duration_s(self) -> float:
        return self.ends[-1] if self.ends else 0.0

    def done_by(self, t: float) -> int:
        """How many events had been emitted ``t`` seconds in."""
        return bisect.bisect_right(self.ends, t)

    def clock(self, t: float) -> float:
        """The run's own clock: stops at its last step."""
        return min(max(t, 0.0), self.duration_s)


# --- speed report ---


@dataclass(frozen=True)
class SpeedReportRequest:
    """Workloads to run, each through the same comparison as the panes (``run_comparison``)."""

    request_id: int
    workloads: tuple[Workload, ...]
    lookahead: LookaheadConfig
    system_prompt: str = ""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int = 64
    loop_guard: bool = False

    def comparison(self, workload: Workload, plain_first: bool) -> CompareRequest:
        messages = [Message("system", self.system_prompt)] if self.system_prompt.strip() else []
        messages.append(Message("user", workload.prompt))
        return CompareRequest(
            request_id=self.request_id,
            messages=tuple(messages),
            lookahead=self.lookahead,
            sampling=self.sampling,
            stop=StopConfig(max_tokens=self.max_tokens, loop_guard=self.loop_guard),
            plain_first=plain_first,
        )


def run_speed_report(
    session: ChatSession,
    request: SpeedReportRequest,
    cancel: threading.Event,
    on_result: Callable[[PromptResult], None] | None = None,
) -> list[PromptResult]:
    """Every workload through ``run_comparison``, alternating which decoder goes first; Stop ends the step in flight.

    Each row is ``engine.speed.comparison.prompt_result`` of its comparison, as ``engine bench``'s rows are:
    the same pairs, median runs, ratio and range for the same prompt and settings. What differs is the input:
    this report sends each prompt as the chat would (its system prompt, sampling and attached files), the
    bench as a bare chat message, greedy, with its oracle bound beside. A prompt measured in part is no row.
    """
    results: list[PromptResult] = []
    for k, workload in enumerate(request.workloads):
        if cancel.is_set():
            break
        comparison = request.comparison(workload, plain_first=k % 2 == 0)
        docs = [read_document(path) for path in workload.attach]
        if docs:  # as a chat message with these files attached: whole or their best passages, drafted from whole
            messages, _ = attach_documents(session, comparison.messages, docs, request.max_tokens)
            comparison = replace(comparison, messages=tuple(messages))
        session.engine.set_documents([d.text for d in docs])
        try:
            result = run_comparison(session, comparison, cancel)
        finally:
            session.engine.set_documents([])
        if not result.complete or cancel.is_set():
            break
        row = prompt_result(workload, result)
        results.append(row)
        if on_result is not None:
            on_result(row)
    return results


@dataclass(frozen=True)
class SpeedReportProgress:
    request_id: int
    result: PromptResult
    done: int
    total: int


@dataclass(frozen=True)
class SpeedReportOutcome:
    request_id: int
    results: tuple[PromptResult, ...]
    total: int
    cancelled: bool
    error: str | None = None
