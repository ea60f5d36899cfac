"""Settings kept between runs, as one dataclass stored as JSON in the config dir.

JSON rather than QSettings: readable, diffable, and redirected with the rest
of the app's files by ``LOOKAHEAD_CHAT_HOME``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.settings import DEFAULT_FIXED

from . import paths

log = logging.getLogger(__name__)

MAX_RECENT_MODELS = 8
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass
class AppSettings:
    """Everything the user can set that should survive a restart."""

    model_path: str = ""  # "" = the bundled default model
    recent_models: list[str] = field(default_factory=list)
    lookahead_on: bool = True
    auto: bool = True  # Auto sizes every step from this machine's measured costs
    window: int = DEFAULT_FIXED.window
    ngram: int = DEFAULT_FIXED.ngram
    guesses: int = DEFAULT_FIXED.guesses
    temperature: float = 0.0  # greedy by default
    top_p: float = 0.95
    seed: int = 0
    max_tokens: int = 512
    n_ctx: int = 4096
    threads: int = 0  # 0 = let the engine pick
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # for new chats
    show_lookahead: bool = False  # View → Show lookahead: replies tinted by how each run of text came
    geometry: str = ""  # QWidget.saveGeometry(), base64
    splitter_state: str = ""

    def add_recent_model(self, path: str) -> None:
        """Put ``path`` first in the recent list (no duplicates, bounded)."""
        self.recent_models = [path] + [p for p in self.recent_models if p != path]
        del self.recent_models[MAX_RECENT_MODELS:]

    @classmethod
    def load(cls, path: Path | None = None) -> AppSettings:
        """Read settings; a missing or unreadable file gives the defaults (never an error at startup)."""
        path = path or paths.settings_path()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable settings file %s: %s", path, exc)
            return cls()
        if not isinstance(raw, dict):
            return cls()
        defaults = cls()
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                continue
            value = raw[f.name]
            default = getattr(defaults, f.name)
            # Keep a default when the stored type is wrong (hand-edited file, older version).
            if isinstance(default, bool) != isinstance(value, bool):
                continue
            if isinstance(default, float) and isinstance(value, int):
                value = float(value)
            if isinstance(value, type(default)):
                values[f.name] = value
        return cls(**values)

    def save(self, path: Path | None = None) -> None:
        """Write atomically, so a crash mid-write never leaves a half file."""
        path = path or paths.settings_path()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2), encoding="utf-8")
        os.replace(tmp, path)
