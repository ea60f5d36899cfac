"""A local OpenAI-compatible server for the loaded model: other programs get plain decoding's text, faster.

``requests`` checks request bodies, ``jobs`` runs them on the thread that owns the engine, ``responses`` folds
a generation into OpenAI's objects, ``api`` is the HTTP side (aiohttp). Never imports Qt: the app only starts, stops and shows it.
"""

from engine.server.api import DEFAULT_PORT, ModelServer, ServerConfig, ServerStats
from engine.server.jobs import EngineRunner, Job, JobRunner
from engine.server.requests import ApiError, CompletionRequest

__all__ = [
    "DEFAULT_PORT",
    "ApiError",
    "CompletionRequest",
    "EngineRunner",
    "Job",
    "JobRunner",
    "ModelServer",
    "ServerConfig",
    "ServerStats",
]
