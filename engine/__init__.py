"""Lookahead Chat's decoding engine: llama.cpp batched evaluation, plain and lookahead decoding.

Never imports Qt; the desktop app in ``app/`` drives it from a worker thread.
"""

from .measure import RunStats
from .models import GgufSummary, ModelFileError, check_gguf, default_model_path
from .native import NativeError
from .runtime import (
    Engine,
    GenerationControls,
    LookaheadUnsupportedError,
    PromptTooLongError,
    StepEvent,
)
from .session import ChatSession
from .settings import LookaheadConfig, SamplingConfig, SettingsError, StopConfig
from .text import Message, TemplateRenderError

__all__ = [
    "ChatSession",
    "Engine",
    "GenerationControls",
    "GgufSummary",
    "LookaheadConfig",
    "LookaheadUnsupportedError",
    "Message",
    "ModelFileError",
    "NativeError",
    "PromptTooLongError",
    "RunStats",
    "SamplingConfig",
    "SettingsError",
    "StepEvent",
    "StopConfig",
    "TemplateRenderError",
    "check_gguf",
    "default_model_path",
]
