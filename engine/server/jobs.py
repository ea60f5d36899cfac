"""Server requests as jobs on the thread that owns the engine, one at a time.

A ``Job`` is made on the HTTP side and run by whoever owns the engine: ``EngineRunner`` for ``python -m engine
serve``, the app's engine worker in the desktop app (there chat replies and server requests share one queue).
The job tells its outcome through ``sink``, called on the engine's thread: each ``StepEvent``, then ``FINISHED``,
or an ``ApiError`` instead.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from engine.decoding.grammar import Constraint
from engine.decoding.runtime import Engine, GenerationControls, LookaheadUnsupportedError, PromptTooLongError
from engine.decoding.text import TemplateRenderError
from engine.llama.problems import SettingsError
from engine.server.requests import ApiError, CompletionRequest
from engine.server.tools import ToolsUnsupported, markup_of

log = logging.getLogger("engine.server")

FINISHED = object()  # the sink's last item after the events of a generation that ran to its end


class Job:
    """One request's generation. ``cancel`` stops it between two steps (a client that went away)."""

    def __init__(self, request: CompletionRequest, sink: Callable[[object], None]) -> None:
        self.request = request
        self.cancel = threading.Event()
        self.started = threading.Event()  # set when the engine's thread takes it up
        self._sink = sink

    def run(self, engine: Engine) -> None:
        """Generate on ``engine`` (the calling thread owns it) and hand each event to the sink."""
        self.started.set()
        if self.cancel.is_set():
            self._sink(FINISHED)
            return
        try:
            self._generate(engine)
        except ApiError as exc:
            self._sink(exc)
        except PromptTooLongError as exc:  # the engine's own check, in both numbers
            field = "messages" if self.request.messages is not None else "prompt"
            self._sink(ApiError(400, str(exc), "context_length_exceeded", field))
        except (SettingsError, TemplateRenderError, LookaheadUnsupportedError) as exc:
            self._sink(ApiError(400, str(exc), "invalid_value"))
        except Exception:  # the engine failed: the client hears that it did (not the exception's text), the server
            log.exception("generation failed")  # goes on
            self._sink(ApiError(500, "the generation failed", "generation_failed", kind="server_error"))
        else:
            self._sink(FINISHED)

    def fail(self, message: str) -> None:
        """Answer the job without running it (the model went away before its turn)."""
        self._sink(ApiError(503, message, "model_unavailable", kind="server_error"))

    def _generate(self, engine: Engine) -> None:
        req = self.request
        tools, constraint = _tools_and_constraint(engine, req)
        if req.messages is not None:
            tokens = engine.render_chat(req.messages, tools=tools)
        else:
            tokens = engine.tokenize(req.prompt or "")
        room = engine.n_ctx - len(tokens)  # none left: engine.generate refuses the prompt (PromptTooLongError)
        lookahead = req.lookahead
        if lookahead is not None and engine.lookahead_block_reason:
            if req.lookahead_asked != "auto":
                raise ApiError(400, f"lookahead: {engine.lookahead_block_reason}", "unsupported_parameter", "lookahead")
            lookahead = None  # Auto on a model that cannot draft is plain decoding
        controls = GenerationControls(lookahead=lookahead, cancel=self.cancel)
        for event in engine.generate(tokens, controls=controls, sampling=req.sampling, stop=req.stop_config(room),
                                     constraint=constraint):
            self._sink(event)


def _tools_and_constraint(engine: Engine, req: CompletionRequest) -> tuple[tuple[dict, ...], Constraint | None]:
    """The tools to show the model and the grammar its reply follows: the tool calls' (in the markup the loaded
    model writes), else the structured output asked for, else none."""
    use = req.tool_use
    if use is None:
        return (), req.constraint
    try:
        markup = markup_of(engine.template)
    except ToolsUnsupported as exc:
        if not use.calls_allowed:  # "none": the model answers in text, without seeing the tools
            return (), req.constraint
        raise ApiError(400, f"tools: {exc}", "unsupported_parameter", "tools") from None
    return use.tools, use.constraint(markup)


class JobRunner(Protocol):
    """Runs jobs on the engine's thread, in the order given."""

    def submit(self, job: Job) -> None: ...


class EngineRunner:
    """A thread that owns ``engine`` and runs submitted jobs one at a time (the headless server's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._closing = ""  # set: jobs still waiting are answered with it
        self._running: Job | None = None
        self._thread = threading.Thread(target=self._run, name="engine-runner", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self._closing:
            job.fail(self._closing)
        else:
            self._jobs.put(job)

    def close(self, message: str = "the server is shutting down") -> None:
        """Stop the running job, answer those still waiting with ``message`` and end the thread."""
        self._closing = message
        running = self._running
        if running is not None:
            running.cancel.set()
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._closing:
                job.fail(self._closing)
                continue
            self._running = job
            try:
                job.run(self.engine)
            finally:
                self._running = None
        while True:  # submitted after the end marker
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.fail(self._closing)
