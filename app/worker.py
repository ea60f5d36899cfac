"""The engine's worker: one ``EngineWorker`` on one ``QThread`` owns the engine.

The GUI never calls the engine. It emits signals that are queued to the
worker's thread (load a model, generate a reply); the worker answers with
signals that are queued back. What must reach the worker while it is busy
inside a generation (stop, a new lookahead shape) goes through the directly
connected slots of ``WorkerControls`` (app/worker_controls.py), which it is
built on; ``EngineThread`` (app/engine_thread.py) starts its thread and wires it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot

from engine import (
    ChatSession,
    Engine,
    GenerationControls,
    LookaheadUnsupportedError,
    ModelFileError,
    NativeError,
    PromptTooLongError,
    SettingsError,
    TemplateRenderError,
    default_model_path,
)
from engine.costs.calibration import MachineBusy, MeasurementCancelled
from engine.costs.curve import CostCurve
from engine.decoding.attaching import attach_documents
from engine.decoding.opening import ModelOpener
from engine.library.names import friendly_name
from engine.llama.backend import system_features
from engine.llama.kernels import matrix_kernels
from engine.llama.probe import ProbeResult, ensure_loadable
from engine.llama.problems import LoadProblem
from engine.server import Job
from engine.server.tools import takes_tool_calls
from engine.speed.comparison import CompareProgress
from engine.speed.rows import PromptResult

from .attachments import ReplySources
from .comparison_jobs import (
    CompareRequest,
    SpeedReportOutcome,
    SpeedReportProgress,
    SpeedReportRequest,
    run_comparison,
    run_speed_report,
)
from .requests import DocumentsPlaced, GenerationRequest, LoadedModel, ReplyOutcome, StepUpdate
from .worker_controls import WorkerControls

log = logging.getLogger(__name__)

BUSY_MEASURE_TEXT = (
    "Another program is using the CPU, so this PC was not measured for lookahead: "
    "Auto plans with a cautious default and measures when the PC is quieter"
)

_USER_ERRORS = (
    ModelFileError,
    NativeError,
    PromptTooLongError,
    SettingsError,
    LookaheadUnsupportedError,
    TemplateRenderError,
)


class EngineWorker(WorkerControls):
    """Owns the engine; lives on its own QThread. The slots other threads call directly (stop, setLookahead…)
    are ``WorkerControls``'.

    Signals:
        modelLoading(float): load progress, 0..1.
        modelChecking(): a file opened for the first time is being test-loaded in a child process.
        modelLoaded(object): a ``LoadedModel``; the new engine is in use.
        modelFailed(str): loading failed; the previous engine (if any) is still in use.
        replyStarted(int): the request with this id was accepted (its prompt fits); steps follow.
        documentsPlaced(object): a ``DocumentsPlaced``: what of the new message's files went in its prompt
            (after replyStarted, before the first step; only for a request with attachments).
        stepUpdate(object): a ``StepUpdate`` for every forward pass.
        replyFinished(object): a ``ReplyOutcome``; the generation is over (also after an error mid-way).
        replyFailed(int, str): the request with this id failed; the message is for the user.
        compareProgress(object): a ``CompareProgress`` per step while a comparison is measured.
        compareFinished(object): a ``CompareResult``: both runs (or as far as they got before Stop).
        compareFailed(int, str): the comparison with this id failed; the message is for the user.
        reportProgress(object): a ``SpeedReportProgress`` per prompt of a speed report.
        reportFinished(object): a ``SpeedReportOutcome``: the report is over (done, cancelled or failed).
        measureProgress(float): measuring this machine's cost curve for Auto, 0..1.
        measureFinished(int, str, str): measurement ``id`` is over: ("measured" | "cached" | "cancelled" |
            "unneeded" | "failed" | "busy", a sentence for the user).
        promptProgress(int, int, int): request ``id`` has read this many of its prompt's new tokens, of so many.
        readAheadDone(int): a read ahead of the next prompt's start ended, having read this many tokens.
    """

    modelLoading = Signal(float)
    modelChecking = Signal()
    modelLoaded = Signal(object)
    modelFailed = Signal(str)
    replyStarted = Signal(int)
    documentsPlaced = Signal(object)
    stepUpdate = Signal(object)
    replyFinished = Signal(object)
    replyFailed = Signal(int, str)
    compareProgress = Signal(object)
    compareFinished = Signal(object)
    compareFailed = Signal(int, str)
    reportProgress = Signal(object)
    reportFinished = Signal(object)
    measureProgress = Signal(float)
    measureFinished = Signal(int, str, str)
    promptProgress = Signal(int, int, int)
    readAheadDone = Signal(int)
    _readAheadLater = Signal()  # to itself, queued: once the slot running now has returned
    _probeThreadsLater = Signal()

    def __init__(
        self,
        engine_factory: Callable[..., Engine] = Engine,
        session_factory: Callable[[Engine], ChatSession] = ChatSession,
        default_model: Callable[[], Path] = default_model_path,
        check_loadable: Callable[..., ProbeResult] = ensure_loadable,
    ) -> None:
        """``engine_factory``, ``check_loadable`` and ``default_model`` are the ``ModelOpener``'s (the command line
        opens models the same way), ``session_factory`` builds a chat session on the engine; tests pass fakes."""
        super().__init__()
        self._opener = ModelOpener(engine_factory, check_loadable, default_model)
        self._session_factory = session_factory
        self._engine: Engine | None = None
        self._session: ChatSession | None = None
        self._readAheadLater.connect(self.readAhead, Qt.ConnectionType.QueuedConnection)
        self._probeThreadsLater.connect(self.probeThreads, Qt.ConnectionType.QueuedConnection)

    # --- slots run on the worker thread (queued) ---

    @Slot(str, int, int)
    def loadModel(self, path: str, n_ctx: int, n_threads: int) -> None:
        """Load ``path`` ("" = the bundled model); keep the current engine if it fails.

        A failure's text is ``LoadProblem.as_text()``: plain words for a person, then the technical detail.
        """
        t0 = time.perf_counter()
        self.modelLoading.emit(0.0)
        with self._lock:  # before the engine is in use: a reply asked for as soon as it is stops the probe
            self._probe_cancel = threading.Event()

        def progress(frac: float) -> bool:
            self.modelLoading.emit(float(frac))
            return not self._shutting_down.is_set()  # False aborts the load

        try:
            # A file never loaded before is loaded in a child first: damage that makes llama.cpp
            # abort kills the child, not the app (and the model in use stays).
            self.modelChecking.emit()
            opened = self._opener.open(path, n_ctx, n_threads, progress=progress,
                                       cancel=self._shutting_down)  # closing the window kills the child
        except Exception as exc:  # every failure becomes a message for the user, with its technical detail
            log.warning("model load failed: %s", exc, exc_info=True)
            self.modelFailed.emit(LoadProblem.from_exception(exc, _describe(exc)).as_text())
            return
        engine, model_path, probe = opened.engine, opened.path, opened.probe
        old, self._engine, self._session = self._engine, engine, self._session_factory(engine)
        if old is not None:
            old.close()
        engine.draft_from_earlier_chats()  # drafts from earlier chats and kept n-grams: see rememberChats
        s = engine.summary
        loaded = LoadedModel(
            path=str(model_path),
            display_name=friendly_name(s.name, model_path),
            gguf_name=s.name,
            architecture=s.architecture,
            file_type=s.file_type,
            n_ctx=engine.n_ctx,
            n_params=engine.info.n_params,
            n_threads=engine.n_threads,
            lookahead_block_reason=engine.lookahead_block_reason,
            lookahead_kind=engine.lookahead_kind,
            load_s=time.perf_counter() - t0,
            probe_s=probe.seconds if probe.probed else None,
            template_source=engine.template.source,
            template_is_fallback=engine.template.is_fallback,
            template_format=engine.template.built_in.name if engine.template.built_in is not None else "",
            n_ctx_train=s.context_length,
            size_bytes=s.size_bytes,
            batch_kernels=tuple(k.describe for k in matrix_kernels(dict(s.matrix_types), system_features())),
            takes_tools=takes_tool_calls(engine.template),
        )
        self.modelLoaded.emit(loaded)
        self._probeThreadsLater.emit()
        self._read_ahead_later()  # the chat in view, for this model

    @Slot(str, object)
    def rememberChats(self, model_path: str, texts: list[str]) -> None:
        """Let lookahead draft from these earlier chats, if ``model_path`` is still the model in use."""
        engine = self._engine
        if engine is None or str(engine.summary.path) != model_path:
            return  # another model was loaded meanwhile: its chats are not this one's
        for text in texts:
            if self._shutting_down.is_set():
                return
            engine.remember_chat(engine.tokenize(text, add_special=False))

    @Slot(object)
    def generate(self, request: GenerationRequest) -> None:
        """Generate one reply, emitting a ``StepUpdate`` per step; ends with replyFinished or replyFailed.

        One piece on purpose: it is the reply's whole life on the worker thread, from the request to the one
        signal that ends it, and every exit path must emit exactly one of them."""
        if self._session is None:
            self.replyFailed.emit(request.request_id, "No model is loaded. Open a model with Model → Open model….")
            return
        controls = GenerationControls(lookahead=request.lookahead)
        controls.on_prompt = lambda done, total: self.promptProgress.emit(request.request_id, done, total)
        with self._lock:
            self._controls = controls
            self._pending_lookahead = None
        started = False
        n_tokens = 0
        reply_tokens: list[int] = []
        steps_after_stop = 0
        stop_reason: str | None = None
        session, engine = self._session, self._engine
        assert engine is not None  # set with the session
        try:
            messages = list(request.messages)
            placed: DocumentsPlaced | None = None
            if request.attachments and messages:
                # What of the new message's files fits before its text, with room for the reply.
                messages, context = attach_documents(
                    session, messages, [a.document() for a in request.attachments], request.stop.max_tokens
                )
                tokens = {a.name: len(engine.tokenize(a.text, add_special=False)) for a in request.attachments}
                placed = DocumentsPlaced(request.request_id, ReplySources.of_context(context), context.text, tokens)
            # Every reply sets them, [] too: a chat without files never drafts from another chat's.
            engine.set_documents(list(request.documents))
            events = session.reply(
                messages,
                controls=controls,
                sampling=request.sampling,
                stop=request.stop,
                drafts_from=request.drafts_from,
            )
            started = True
            self.replyStarted.emit(request.request_id)
            if placed is not None:  # queued after replyStarted: the user's message is saved when it arrives
                self.documentsPlaced.emit(placed)
            while True:
                requested = self._apply_pending_lookahead(controls)
                ev = next(events, None)  # the engine reads controls.lookahead here, for this step
                if ev is None:
                    break
                after_stop = controls.cancel.is_set()
                if after_stop and ev.n_committed:
                    steps_after_stop += 1
                n_tokens += len(ev.token_ids)
                reply_tokens.extend(ev.token_ids)
                stop_reason = ev.stop_reason or stop_reason
                self.stepUpdate.emit(StepUpdate(request.request_id, ev, requested, after_stop))
        except Exception as exc:  # every failure becomes a message for the user
            log.warning("generation failed: %s", exc, exc_info=True)
            if not started:
                self.replyFailed.emit(request.request_id, _describe(exc))
            else:
                outcome = ReplyOutcome(
                    request.request_id, stop_reason, n_tokens, steps_after_stop, error=_describe(exc)
                )
                self.replyFinished.emit(outcome)
            return
        finally:
            with self._lock:
                self._controls = None
        self.replyFinished.emit(ReplyOutcome(request.request_id, stop_reason, n_tokens, steps_after_stop))
        # The finished exchange joins the earlier chats the next ones may draft from: what the person wrote and
        # the reply, not the files' text (``request.messages`` never holds the new message's; ``user_words`` is
        # a regenerated message's own text).
        engine = self._engine
        if engine is not None and request.messages and reply_tokens:
            words = request.messages[-1].content if request.user_words is None else request.user_words
            engine.remember_chat(engine.tokenize(f"{words}\n", add_special=False) + reply_tokens)
            engine.save_kept_ngrams()

    @Slot(int)
    def measureMachine(self, request_id: int) -> None:
        """Measure what a batch costs here, for Auto (a few seconds, once per model).

        Meant for idle time: ``interruptMeasurement`` with this id or a later one
        stops it (also before it starts), so a reply asked for meanwhile waits at
        most one decode and plans with the reference curve (see ``Engine.tune``).
        The cache holds what it held before after it (a chat read ahead stays).
        """
        engine = self._engine
        if engine is None or engine.lookahead_block_reason is not None:
            self.measureFinished.emit(request_id, "unneeded", "")
            return
        if engine.load_cached_curve():
            self.measureFinished.emit(request_id, "cached", "")
            return
        cancel = threading.Event()
        with self._lock:
            if request_id <= self._measure_cancelled_upto or self._shutting_down.is_set():
                cancel.set()
            self._measuring = (request_id, cancel)
        t0 = time.perf_counter()
        try:
            curve = engine.tune(progress=self.measureProgress.emit, cancel=cancel)
        except MachineBusy:
            self.measureFinished.emit(request_id, "busy", BUSY_MEASURE_TEXT)
            return
        except MeasurementCancelled:
            self.measureFinished.emit(request_id, "cancelled", "")
            return
        except Exception as exc:  # a failed measurement only leaves Auto on the reference curve
            log.warning("cost measurement failed: %s", exc, exc_info=True)
            self.measureFinished.emit(request_id, "failed", _describe(exc))
            return
        finally:
            with self._lock:
                self._measuring = None
        took = f"Measured this PC for lookahead in {time.perf_counter() - t0:.0f} s"
        if isinstance(curve, CostCurve):  # the result in a few words: what a typical batch of guesses costs
            took += f": batches of 4 tokens cost {curve.cost(4):.1f} steps"
        self.measureFinished.emit(request_id, "measured", took)

    @Slot()
    def readAhead(self) -> None:
        """Read the start of the next prompt (``wantReadAhead``'s) into the cache, a chunk at a time, until done or
        interrupted by anything the user asks for (a reply, a comparison, another chat, closing)."""
        with self._lock:
            request, cancel = self._read_ahead, self._read_ahead_cancel  # made when it was queued
        session = self._session
        if request is None or session is None or cancel.is_set() or self._shutting_down.is_set():
            return
        docs = [a.document() for a in request.attachments]
        try:
            read = session.read_ahead(list(request.messages), docs, request.max_tokens, cancel=cancel)
        except Exception as exc:  # reading ahead is only a head start: the reply reads what is missing
            log.warning("reading ahead failed: %s", exc, exc_info=True)
            return
        if read:
            log.info("read %d tokens of the next prompt ahead", read)
        self.readAheadDone.emit(read)

    @Slot(object)
    def serveJob(self, job: Job) -> None:
        """Run a request of the local server (engine/server) on the engine, in turn with the chat's replies.

        The chat's attached files, its earlier chats and kept n-grams are left out of it: what another program
        asks is not the user's chat.
        """
        engine = self._engine
        if engine is None:
            job.fail("no model is loaded in Lookahead Chat")
            return
        if self._shutting_down.is_set():
            job.fail("Lookahead Chat is closing")
            return
        with self._lock:
            self._serving = job
        keep, engine.keep_replies = engine.keep_replies, False
        try:
            engine.set_documents([])
            job.run(engine)
        finally:
            engine.keep_replies = keep
            with self._lock:
                self._serving = None
        self._read_ahead_later()  # the request's prompt replaced the chat's in the cache

    @Slot()
    def probeThreads(self) -> None:
        """Find out whether the thread count may change (about a second, once per model; after a load), so the
        thread governor works from the first reply; interrupted like reading ahead, it waits for the measurement."""
        with self._lock:
            cancel = self._probe_cancel  # made when it was queued
        engine = self._engine
        if engine is None or cancel.is_set() or self._shutting_down.is_set():
            return
        try:
            engine.probe_threads(cancel)
        except MeasurementCancelled:
            return
        except Exception as exc:  # the governor then stays off until a measurement finds out
            log.warning("thread probe failed: %s", exc, exc_info=True)

    @Slot(object)
    def compare(self, request: CompareRequest) -> None:
        """Measure plain and lookahead in repeated A-B-B-A turns on one prompt; ends with compareFinished."""
        if self._session is None:
            self.compareFailed.emit(request.request_id, "No model is loaded. Open a model with Model → Open model….")
            return
        cancel = self._start_job()

        def progress(p: CompareProgress) -> None:
            self.compareProgress.emit(p)

        try:
            self._session.engine.set_documents([])  # the Compare tab's prompt has no files: no chat's are drafted from
            result = run_comparison(self._session, request, cancel, on_progress=progress)
        except Exception as exc:  # every failure becomes a message for the user
            log.warning("comparison failed: %s", exc, exc_info=True)
            self.compareFailed.emit(request.request_id, _describe(exc))
            return
        finally:
            self._end_job()
        self.compareFinished.emit(result)

    @Slot(object)
    def speedReport(self, request: SpeedReportRequest) -> None:
        """Run the workloads through the same comparison as the panes; Stop cancels at the next step."""
        total = len(request.workloads)
        results: list[PromptResult] = []
        if self._session is None:
            self.reportFinished.emit(SpeedReportOutcome(request.request_id, (), total, False, "No model is loaded."))
            return
        cancel = self._start_job()

        def on_result(r: PromptResult) -> None:
            results.append(r)
            self.reportProgress.emit(SpeedReportProgress(request.request_id, r, len(results), total))

        error = None
        try:
            run_speed_report(self._session, request, cancel, on_result)
        except Exception as exc:  # every failure becomes a message for the user
            log.warning("speed report failed: %s", exc, exc_info=True)
            error = _describe(exc)
        finally:
            self._end_job()
        cancelled = cancel.is_set() and len(results) < total
        self.reportFinished.emit(SpeedReportOutcome(request.request_id, tuple(results), total, cancelled, error))

    def _start_job(self) -> threading.Event:
        cancel = threading.Event()
        with self._lock:
            self._job_cancel = cancel
        if self._shutting_down.is_set():
            cancel.set()
        return cancel

    def _end_job(self) -> None:
        with self._lock:
            self._job_cancel = None
        self._read_ahead_later()  # the job's runs emptied the cache

    def _read_ahead_later(self) -> None:
        """Read ahead once the slot running now has returned (and after what was queued before); anything the user
        asks for from now on stops it."""
        with self._lock:
            self._read_ahead_cancel = threading.Event()
        self._readAheadLater.emit()

    @Slot()
    def shutdown(self) -> None:
        """Free the engine on its own thread, then end the thread's event loop."""
        if self._engine is not None:
            self._engine.close()
            self._engine = self._session = None
        thread = self.thread()
        if thread is not None:
            thread.quit()


def _describe(exc: BaseException) -> str:
    """The user-facing text of an exception.

    The engine's own errors already say what and why; anything else is
    unexpected, so its type is kept to make a bug report useful.
    """
    if isinstance(exc, _USER_ERRORS):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
