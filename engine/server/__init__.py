"""A local OpenAI-compatible server for the loaded model: other programs get plain decoding's text, faster.

``config`` says where and how it listens, ``requests`` checks request bodies, ``jobs`` runs them on the thread
that owns the engine, ``responses`` folds a generation into OpenAI's objects, ``api`` is the HTTP side
(``ModelServer``, on aiohttp). This package's face leaves ``api`` out: a program that only shows the server's
settings does not load aiohttp. Never imports Qt: the app only starts, stops and shows it.
"""

from engine.server.config import DEFAULT_PORT, ServerConfig, ServerStats
from engine.server.jobs import EngineRunner, Job, JobRunner
from engine.server.requests import ApiError, CompletionRequest

__all__ = [
    "DEFAULT_PORT",
    "ApiError",
    "CompletionRequest",
    "EngineRunner",
    "Job",
    "JobRunner",
    "ServerConfig",
    "ServerStats",
]
