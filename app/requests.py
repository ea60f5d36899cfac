"""What the window asks of the engine's worker, and what the worker answers. No Qt here.

The worker (app/worker.py) sends these across threads in its signals; the chat
controller and the tests build and read them without Qt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import LookaheadConfig, Message, SamplingConfig, StepEvent, StopConfig
from engine.library.names import LookaheadKind

from .attachments import Attachment, ReplySources


@dataclass(frozen=True)
class LoadedModel:
    """Facts about the model now in use, for the status bar, the stats lines and Model → Chat template…."""

    path: str
    display_name: str
    gguf_name: str
    architecture: str
    file_type: str
    n_ctx: int
    n_params: int
    n_threads: int
    lookahead_block_reason: str | None
    load_s: float
    probe_s: float | None = None  # the first-open check in a child process, when it ran
    template_source: str = ""  # the chat template the conversation is rendered with (Jinja2 source)
    template_is_fallback: bool = False  # the file has no chat template: a built-in one is used
    # ... the built-in format its vocabulary's turn markers name ("Gemma"); "" for the generic ChatML
    template_format: str = ""
    n_ctx_train: int | None = None  # the context the model was trained with (GGUF header), when it says
    size_bytes: int = 0  # the model file's size
    # each weight type's matrices and the kernel that multiplies a batch by them here (engine/llama/kernels.py)
    batch_kernels: tuple[str, ...] = ()
    lookahead_kind: str = LookaheadKind.FULL
    takes_tools: bool = False  # the server can offer this model tools (its template takes them: engine/server/tools.py)


@dataclass(frozen=True)
class GenerationRequest:
    """One reply to generate: the whole conversation so far, ending with the user's turn."""

    request_id: int
    messages: tuple[Message, ...]
    lookahead: LookaheadConfig | None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    drafts_from: tuple[str, ...] = ()  # texts this reply replaces (regenerate, edit): drafts for lookahead
    # The new user message's files: the worker places what fits of them before its text (``DocumentsPlaced``).
    attachments: tuple[Attachment, ...] = ()
    documents: tuple[str, ...] = ()  # the text of every file on the branch answered: lookahead drafts from them
    # The last user message as the person wrote it, when ``messages`` sends it with its files' text placed
    # before it (a regenerated reply): what the drafts from earlier chats keep. None: ``messages[-1].content``.
    user_words: str | None = None


@dataclass(frozen=True)
class ReadAheadRequest:
    """What the next message's prompt will begin with, to read into the cache while the user writes it: the chat
    so far (``messages``, without a new user message) and the files attached to the message being written."""

    messages: tuple[Message, ...]
    attachments: tuple[Attachment, ...] = ()
    max_tokens: int = 512


@dataclass(frozen=True)
class DocumentsPlaced:
    """What of the new message's files the worker put before its text, sent before the reply's first step.

    ``text`` is the files' part of the message as the model reads it (also ``sources.text``); ``tokens``
    maps each file's name to its whole text's token count for the model in use (not only the part placed).
    """

    request_id: int
    sources: ReplySources
    text: str
    tokens: dict[str, int]


@dataclass(frozen=True)
class StepUpdate:
    """One step event, with the lookahead setting the worker handed the engine for that step."""

    request_id: int
    event: StepEvent
    requested: LookaheadConfig | None
    after_stop: bool  # the stop request was already set when this event was emitted


@dataclass(frozen=True)
class ReplyOutcome:
    """How a generation ended (the text and statistics come with the step updates)."""

    request_id: int
    stop_reason: str | None
    n_tokens: int
    steps_after_stop: int  # committing steps emitted after Stop was pressed (at most the one in flight)
    error: str | None = None
