"""Plain against lookahead on the user's prompt, for the Compare tab and the speed report.

No Qt here. ``run_comparison`` and ``run_speed_report`` run on the worker
thread (it owns the engine) and measure with ``engine.speed.comparison``, as
``engine bench`` does: the same A-B-B-A pairs, the same median runs and ratio,
the same ``Verdict``. What is the app's: the chat's context, system prompt and
sampling, attached files, the replay clock of the panes and the report's
tables.
"""

from __future__ import annotations

import bisect
import csv
import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine import ChatSession, LookaheadConfig, Message, SamplingConfig, StepEvent, StopConfig
from engine.documents import read_document, with_documents
from engine.speed.comparison import (
    BUSY_NOTE,
    CompareProgress,
    Comparison,
    compare_decoders,
    prompt_result,
    speedup_cell,
)
from engine.speed.measure import ALL, CategoryRow, PromptResult, Workload, by_category, geomean

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

    def comparison(self, workload: Workload, plain_first: bool) -> CompareRequest:
        messages = [Message("system", self.system_prompt)] if self.system_prompt.strip() else []
        messages.append(Message("user", workload.prompt))
        return CompareRequest(
            request_id=self.request_id,
            messages=tuple(messages),
            lookahead=self.lookahead,
            sampling=self.sampling,
            stop=StopConfig(max_tokens=self.max_tokens),
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
            messages = list(comparison.messages)
            context = session.documents_context(messages, docs, request.max_tokens)
            messages[-1] = Message("user", with_documents(workload.prompt, context))
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


PROMPT_COLUMNS = (
    "id", "category", "tokens", "plain tok/s", "lookahead tok/s", "speedup", "steps predict", "tokens/step",
    "identical",
)
CATEGORY_COLUMNS = (
    "category", "prompts", "speedup (geomean)", "steps predict (geomean)", "tokens/step (mean)", "identical",
)


def _predicted(r: PromptResult) -> float:
    return float(r.extra.get("steps_predict", 0.0))


def _ratio(x: float) -> str:
    return f"{x:.2f}×" if x > 0 else "–"


def prompt_cells(r: PromptResult) -> list[str]:
    return [
        r.id, r.cat, str(r.n_tokens), f"{r.plain_tps:.1f}", f"{r.lookahead_tps:.1f}", speedup_cell(r),
        _ratio(_predicted(r)), f"{r.tokens_per_step:.2f}", "yes" if r.identical else "no",
    ]


def predicted_by_category(results: Sequence[PromptResult]) -> dict[str, float]:
    """The steps' predicted gain per category (geometric mean), and over all of them under ``ALL``."""
    groups: dict[str, list[float]] = {}
    for r in results:
        groups.setdefault(r.cat, []).append(_predicted(r))
        groups.setdefault(ALL, []).append(_predicted(r))
    return {cat: geomean(values) for cat, values in groups.items()}


def category_cells(c: CategoryRow, predicted: float = 0.0) -> list[str]:
    return [c.cat, str(c.n), f"{c.speedup:.2f}×", _ratio(predicted), f"{c.tokens_per_step:.2f}",
            f"{c.identical}/{c.n}"]


def report_summary(results: Sequence[PromptResult]) -> str:
    """One paragraph over every row: the measured and the predicted gain, and what no row may claim."""
    if not results:
        return "No prompts measured."
    overall = by_category(results)[-1]
    predicted = predicted_by_category(results)[ALL]
    n = len(results)
    text = f"Lookahead {overall.speedup:.2f}× as fast as plain (geometric mean of {n} prompt{'s' if n != 1 else ''})"
    text += f"; the steps predict {predicted:.2f}×." if predicted > 0 else "."
    same = sum(bool(r.extra.get("same_steps")) for r in results)
    unclear = sum(not r.extra.get("measurable", True) and not r.extra.get("same_steps") for r in results)
    if same:
        text += f" {same} of {n} took the same steps as plain: no speedup to claim there."
    if unclear:
        text += f" {unclear} of {n} showed no measurable difference (their repeats spanned 1.00×)."
    if any(r.extra.get("busy") for r in results):
        text += f" {BUSY_NOTE}"
    return text


def report_csv(results: Sequence[PromptResult]) -> str:
    """One row per prompt, then one per category (its id column empty), as CSV."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "category", "tokens", "plain_tok_s", "lookahead_tok_s", "speedup", "tokens_per_step",
                     "identical", "plain_s", "lookahead_s", "speedup_low", "speedup_high", "pairs", "steps_predict",
                     "same_steps", "busy"])
    for r in results:
        x = r.extra
        writer.writerow([r.id, r.cat, r.n_tokens, r.plain_tps, r.lookahead_tps, r.speedup, r.tokens_per_step,
                         "yes" if r.identical else "no", r.plain_s, r.lookahead_s, x.get("speedup_low", ""),
                         x.get("speedup_high", ""), x.get("pairs", ""), x.get("steps_predict", ""),
                         _yes_no(x.get("same_steps")), _yes_no(x.get("busy"))])
    predicted = predicted_by_category(results)
    for c in by_category(results):
        writer.writerow(["", c.cat, "", "", "", round(c.speedup, 4), round(c.tokens_per_step, 3),
                         f"{c.identical}/{c.n}", "", "", "", "", "", round(predicted[c.cat], 4), "", ""])
    return out.getvalue()


def _yes_no(flag: object) -> str:
    return "" if flag is None else "yes" if flag else "no"


def report_markdown(results: Sequence[PromptResult], title: str = "Speed report") -> str:
    """The two tables (per prompt, per category) and the summary, as Markdown."""

    def table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        return lines

    predicted = predicted_by_category(results)
    lines = [f"## {title}", "", report_summary(results), ""]
    lines += table(PROMPT_COLUMNS, [prompt_cells(r) for r in results])
    lines += ["", "### By category", ""]
    lines += table(CATEGORY_COLUMNS, [category_cells(c, predicted[c.cat]) for c in by_category(results)])
    return "\n".join(lines) + "\n"
