"""The app's side of the local server: start and stop it on the loaded model, and hear what it serves.

The server (engine/server) runs on its own thread; its requests reach the engine through the worker's queue
(``EngineThread.serveRequested``), so a chat reply and a server request never run at once and each waits its
turn. While the model is being changed the server is stopped (waiting requests hear why) and started again on
the model that ends up loaded.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import secrets
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from engine.llama.problems import SettingsError
from engine.server import Job, ServerConfig, ServerStats
from engine.server.config import ANY_ADDRESS, ServedModel

from .engine_thread import EngineThread
from .requests import LoadedModel
from .settings import AppSettings

if TYPE_CHECKING:
    from engine.server.api import ModelServer

log = logging.getLogger(__name__)


def new_api_key() -> str:
    return "lc-" + secrets.token_urlsafe(24)


class ServerController(QObject):
    """Serves the loaded model while ``settings.serve_on``; a ``JobRunner`` for the server.

    Signals:
        stateChanged(): started, stopped, or failed to start (``error`` says why).
        statsChanged(object): a ``ServerStats`` copy after each request (queued to the GUI thread).
        requestArrived(): a request was queued for the engine (first-use timing makes way).
    """

    stateChanged = Signal()
    statsChanged = Signal(object)
    requestArrived = Signal()

    def __init__(self, engine: EngineThread, settings: AppSettings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._engine = engine
        self.settings = settings
        self.server: ModelServer | None = None  # engine.server.api's
        self._stopped: ModelServer | None = None  # stopped without waiting: perhaps still sending its last answers
        self.model: LoadedModel | None = None
        self.error = ""

    # -- JobRunner (called on the server's thread) ------------------------------------------------------------

    def submit(self, job: Job) -> None:
        self.requestArrived.emit()
        self._engine.serveRequested.emit(job)

    # -- life ---------------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    @property
    def busy(self) -> bool:
        """A request of another program is running or waiting: a chat reply asked for now waits for it."""
        server = self.server
        return server is not None and (server.stats.running or server.stats.waiting > 0)

    @property
    def base_url(self) -> str:
        return self.server.base_url if self.server is not None else ""

    @property
    def needs_key(self) -> bool:
        """The user asked for a key, or let the network in, which takes one."""
        return self.settings.serve_key_required or self.settings.serve_network

    def config(self) -> ServerConfig:
        s = self.settings
        if self.needs_key and not s.serve_key:
            s.serve_key = new_api_key()
        key = s.serve_key if self.needs_key else ""
        return ServerConfig(host=ANY_ADDRESS[0] if s.serve_network else "127.0.0.1", port=s.serve_port, api_key=key)

    def model_loaded(self, model: LoadedModel) -> None:
        """The model in use changed (or loading it failed and ``model`` is still in use): serve it if asked."""
        self.model = model
        if self.settings.serve_on:
            self.start()

    def model_changing(self) -> None:
        """Another model is being loaded: answer waiting requests and close the port until it is in use."""
        self._stop("the model is being changed in Lookahead Chat; try again when it has loaded")

    def set_serving(self, on: bool) -> None:
        """The user's switch: remembered, and applied now."""
        self.settings.serve_on = on
        if on:
            self.start()
        else:
            self._stop("the server was turned off in Lookahead Chat")

    def restart(self) -> None:
        """Settings changed (port, key, network): serve again with them."""
        self._stop("the server is restarting with new settings; try again")
        if self.settings.serve_on:
            self.start()

    def start(self) -> None:
        if self.model is None:
            self.error = ""
            self.stateChanged.emit()
            return
        self._stop("the server is restarting")
        self._wait_stopped()  # the port is free once the last server's thread has ended (mostly at once)
        from engine.server.api import ModelServer  # aiohttp: loaded once the user serves, not at start-up

        try:
            config = self.config().validate()
            served = ServedModel.of_file(self.model.path)
            server = ModelServer(self, served.id, config, created=served.created, on_change=self._on_change)
            server.start()
        except (OSError, SettingsError) as exc:
            self.error = _start_problem(exc, self.settings.serve_port)
            log.warning("server not started: %s", self.error)
            self.server = None
        else:
            self.error = ""
            self.server = server
        self.stateChanged.emit()

    def shutdown(self) -> None:
        """The window closes: answer what waits, close the port, and wait until the answers are sent (the process
        may end next, and with it the server's thread, mid-answer)."""
        self._stop("Lookahead Chat is closing")
        self._wait_stopped()

    def _stop(self, message: str) -> None:
        """Close the port and return: the server's thread answers what waits with ``message`` and ends on its own,
        so a client that reads slowly, or not at all, never holds up the window."""
        server, self.server = self.server, None
        if server is not None:
            server.stop(message, wait=False)
            self._stopped = server
            self.stateChanged.emit()

    def _wait_stopped(self) -> None:
        stopped, self._stopped = self._stopped, None
        if stopped is not None:
            stopped.join()

    def _on_change(self, stats: ServerStats) -> None:  # the server's thread
        self.statsChanged.emit(dataclasses.replace(stats, history=list(stats.history)))  # a copy for the GUI thread


def _start_problem(exc: BaseException, port: int) -> str:
    if isinstance(exc, OSError):
        if exc.errno == errno.EADDRINUSE:  # each system's own number (Windows: its WSA code)
            return f"port {port} is in use by another program: choose another port"
        if exc.errno in (errno.EACCES, getattr(errno, "WSAEACCES", errno.EACCES)):
            return f"this user may not listen on port {port}: choose one above 1024"
        return f"cannot listen on port {port}: {exc.strerror or exc}"
    return str(exc)
