"""Lookahead Chat's decoding engine: llama.cpp batched evaluation, plain and lookahead decoding.

Never imports Qt; the desktop app in ``app/`` drives it from a worker thread.
"""

from engine.decoding.origins import OWN, DraftOrigin
from engine.decoding.runtime import Engine, GenerationControls, LookaheadUnsupportedError, PromptTooLongError, StepEvent
from engine.decoding.session import ChatSession
from engine.decoding.settings import LookaheadConfig, SamplingConfig, StopConfig
from engine.decoding.text import Message, TemplateRenderError
from engine.llama.bundled import default_model_path
from engine.llama.models import GgufSummary, check_gguf
from engine.llama.native import NativeError
from engine.llama.problems import ModelFileError, SettingsError
from engine.speed.run_stats import RunStats

__all__ = [
    "OWN",
    "ChatSession",
    "DraftOrigin",
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
