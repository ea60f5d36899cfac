"""Where and how the server listens, and what it has served: plain values, no HTTP (the app reads them without
importing aiohttp until the user turns serving on)."""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.llama.problems import SettingsError

DEFAULT_PORT = 8723
MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_WAITING = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
ANY_ADDRESS = ("0.0.0.0", "::")  # every address of this computer


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """Where and how the server listens. ``port`` 0 takes a free port (``ModelServer.port`` tells which)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str = ""
    allowed_origins: tuple[str, ...] = ()  # browser pages that may call the server (CORS); none by default
    max_body_bytes: int = MAX_BODY_BYTES
    max_waiting: int = MAX_WAITING
    lookahead: str = "auto"  # for requests that do not say: "auto" or "off"

    def validate(self) -> ServerConfig:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port {self.port} is out of range 0..65535")
        if not is_loopback(self.host) and not self.api_key:
            raise SettingsError(f"serving on {self.host} lets other computers in: it needs an API key")
        if self.api_key and (len(self.api_key) < 8 or not self.api_key.isprintable() or " " in self.api_key):
            raise SettingsError("the API key must be at least 8 printable characters without spaces")
        if self.lookahead not in ("auto", "off"):
            raise SettingsError(f"lookahead {self.lookahead!r} must be auto or off")
        if self.max_waiting < 0:
            raise SettingsError(f"the queue's length {self.max_waiting} cannot be negative")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"a body limit of {self.max_body_bytes} bytes is too small (at least 1024)")
        return self


@dataclass(frozen=True)
class ServedModel:
    """How the server lists the model file it serves: ``id``, the file's name without ``.gguf``, and ``created``,
    the file's modification time, which stays the same across restarts, so a client that caches the model list
    sees the same model again (the time now stands in for a file that can no longer be read)."""

    id: str
    created: int

    @classmethod
    def of_file(cls, path: str | os.PathLike[str]) -> ServedModel:
        p = Path(path)
        try:
            created = int(p.stat().st_mtime)
        except OSError:
            created = int(time.time())
        return cls(p.stem, created)


@dataclass
class ServerStats:
    """What the server has done, for a status line: read from any thread, written by the server's."""

    served: int = 0  # requests answered with a generation
    refused: int = 0  # requests answered with an error
    last_tokens: int = 0
    last_tokens_per_s: float = 0.0
    last_tokens_per_step: float = 0.0
    last_lookahead: str = ""  # "auto" | "off" | "fixed"
    last_elapsed_s: float = 0.0
    waiting: int = 0
    running: bool = False
    history: list[float] = field(default_factory=list)  # recent requests' seconds, for Retry-After
