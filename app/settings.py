"""Settings kept between runs, as one dataclass stored as JSON in the config dir.

JSON rather than QSettings: readable, diffable, and redirected with the rest
of the app's files by ``LOOKAHEAD_CHAT_HOME``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.decoding.settings import APP_LOOP_GUARD, APP_SAMPLING, DEFAULT_FIXED
from engine.files import write_json_atomic
from engine.server import DEFAULT_PORT

from . import paths

log = logging.getLogger(__name__)

MAX_RECENT_MODELS = 8
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
# Remembered per model file (``AppSettings.per_model``): what suits one model rarely suits another.
PER_MODEL_FIELDS = (
    "n_ctx", "threads", "system_prompt", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
    "repeat_last_n", "dry_multiplier", "seed", "max_tokens", "stop_strings", "loop_guard",
)
_WRONG_TYPE = object()


def _checked(default: object, value: object) -> object:
    """``value`` if it has the default's type (an int is taken for a float), else ``_WRONG_TYPE``."""
    if isinstance(default, bool) != isinstance(value, bool):
        return _WRONG_TYPE
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, list):
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else _WRONG_TYPE
    return value if isinstance(value, type(default)) else _WRONG_TYPE


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
    # The sampler and the loop guard start as the engine's measured defaults (APP_SAMPLING).
    temperature: float = APP_SAMPLING.temperature
    top_k: int = APP_SAMPLING.top_k
    top_p: float = APP_SAMPLING.top_p
    min_p: float = APP_SAMPLING.min_p
    repeat_penalty: float = APP_SAMPLING.repeat_penalty
    repeat_last_n: int = APP_SAMPLING.repeat_last_n
    dry_multiplier: float = APP_SAMPLING.dry_multiplier
    seed: int = APP_SAMPLING.seed
    max_tokens: int = 512
    stop_strings: list[str] = field(default_factory=list)
    loop_guard: bool = APP_LOOP_GUARD  # stop a reply that repeats one passage over and over
    n_ctx: int = 4096
    threads: int = 0  # 0 = let the engine pick
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # for new chats
    show_lookahead: bool = False  # View → Show lookahead: replies tinted by how each run of text came
    library_folders: list[str] = field(default_factory=list)  # Model → Library: folders the user added
    last_model_folder: str = ""  # where Model → Open model… starts ("" = the Downloads folder)
    show_chat_list: bool = True  # View → Chats list (a narrow window may still put it away for a while)
    show_decoding_panel: bool = True  # View → Decoding panel
    open_panel_sections: list[str] = field(default_factory=list)  # the panel's foldable sections shown unfolded
    per_model: dict[str, dict[str, object]] = field(default_factory=dict)  # model path -> PER_MODEL_FIELDS
    # Model → Serve to other programs: the local OpenAI-compatible server (engine/server)
    serve_on: bool = False  # serve the loaded model, from start-up on
    serve_port: int = DEFAULT_PORT
    serve_network: bool = False  # other computers may connect (then only with the key)
    serve_key_required: bool = False
    serve_key: str = ""  # made for the user when first needed
    geometry: str = ""  # QWidget.saveGeometry(), base64
    splitter_state: str = ""

    def add_recent_model(self, path: str) -> None:
        """Put ``path`` first in the recent list (no duplicates, bounded)."""
        self.recent_models = [path] + [p for p in self.recent_models if p != path]
        del self.recent_models[MAX_RECENT_MODELS:]

    def remember_model_settings(self, model_path: str) -> None:
        """Keep the per-model fields as they are now for ``model_path``."""
        self.per_model[model_path] = {name: getattr(self, name) for name in PER_MODEL_FIELDS}

    def model_settings(self, model_path: str) -> dict[str, object]:
        """What was remembered for ``model_path`` (empty if nothing was)."""
        return dict(self.per_model.get(model_path, {}))

    def apply_model_settings(self, model_path: str) -> bool:
        """Take the values remembered for ``model_path``; False if there were none."""
        remembered = self.model_settings(model_path)
        for name, value in remembered.items():
            setattr(self, name, value)
        return bool(remembered)

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
        defaults, settings = cls(), cls()
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                continue
            if f.name == "per_model":
                settings.per_model = _checked_per_model(raw[f.name], defaults)
                continue
            # Keep a default when the stored type is wrong (hand-edited file, older version).
            value = _checked(getattr(defaults, f.name), raw[f.name])
            if value is not _WRONG_TYPE:
                setattr(settings, f.name, value)
        return settings

    def save(self, path: Path | None = None) -> None:
        """Write atomically, so a crash mid-write never leaves a half file."""
        write_json_atomic(path or paths.settings_path(), dataclasses.asdict(self), indent=2)


def _checked_per_model(raw: object, defaults: AppSettings) -> dict[str, dict[str, object]]:
    """The per-model entries whose values have the right types; anything else is dropped."""
    if not isinstance(raw, dict):
        return {}
    checked: dict[str, dict[str, object]] = {}
    for model_path, entry in raw.items():
        if not isinstance(model_path, str) or not isinstance(entry, dict):
            continue
        fields = {}
        for name in PER_MODEL_FIELDS:
            if name in entry:
                value = _checked(getattr(defaults, name), entry[name])
                if value is not _WRONG_TYPE:
                    fields[name] = value
        checked[model_path] = fields
    return checked
