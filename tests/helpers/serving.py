"""A model server of its own for a test: on a free port, stopped and its engine's runner ended whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from engine.server import EngineRunner, ServerConfig
from engine.server.api import ModelServer

if TYPE_CHECKING:
    from engine.decoding.runtime import Engine


@contextmanager
def serving(engine: Engine, model_id: str, **config: Any) -> Iterator[ModelServer]:
    """``engine`` served as ``model_id`` with ``config`` (ServerConfig's fields; port 0 unless given)."""
    runner = EngineRunner(engine)
    try:
        server = ModelServer(runner, model_id, ServerConfig(**{"port": 0, **config}))
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        runner.close()
