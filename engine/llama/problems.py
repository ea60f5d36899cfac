"""What can be wrong with a model file, as a kind and a sentence for people.

Whoever finds a problem names its kind (``ModelFileError.kind``); the sentence the user reads comes from the
kind (``plain_message``). ``explain`` reads a kind only from texts that come without one: llama.cpp's own
refusals, and load-probe verdicts an older version cached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

# What went wrong with a model file, as ``ModelFileError.kind``.
KIND_MISSING = "missing"
KIND_NOT_A_FILE = "not a file"
KIND_UNREADABLE = "unreadable"
KIND_EMPTY = "empty"
KIND_NOT_GGUF = "not gguf"
KIND_TRUNCATED = "truncated"
KIND_VERSION = "version"
KIND_DAMAGED = "damaged"
KIND_ARCHITECTURE = "architecture"
KIND_MEMORY = "memory"
KIND_CRASHED = "crashed"
KIND_TOO_SLOW = "too slow"
KIND_NOT_INSTALLED = "not installed"
KIND_NO_BACKEND = "no backend"  # the app's own llama.cpp libraries, not the model file
KIND_OTHER = "other"
DOWNLOAD_AGAIN = "Download it again, or choose another model."
# How the engine says that ggml found no backend to run a model on (engine/llama/backend.py).
NO_BACKEND_PHRASE = "no llama.cpp backend could be loaded"


class SettingsError(ValueError):
    """A setting is out of range; the message says which and why."""


class ModelFileError(ValueError):
    """A model file is missing, unreadable or not a usable GGUF.

    ``str()`` and ``detail`` are the technical text (in the file format's terms, with the file's
    path) for logs, the command line and bug reports; ``message`` says the same to a person in
    plain words, and ``kind`` names the case (a ``KIND_*`` value). Raisers that know the case pass
    ``kind`` (and ``message`` where the kind's sentence is not enough); a text from outside without a kind
    (llama.cpp's own) is read by ``explain``.
    """

    def __init__(self, detail: str, message: str | None = None, kind: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if kind is None:
            kind = problem_kind(detail)
        if message is None:
            message = plain_message(kind, detail)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class LoadProblem:
    """Why a model did not load, told twice: in plain words for a person, and in technical detail.

    ``as_text``/``from_text`` carry both in one string (a signal's argument between threads).
    """

    message: str
    detail: str = ""
    kind: str = KIND_OTHER

    SEPARATOR: ClassVar[str] = "\n\nTechnical details:\n"

    @classmethod
    def from_exception(cls, exc: BaseException, technical: str | None = None) -> LoadProblem:
        """The problem an exception raised while loading stands for; ``technical`` replaces ``str(exc)``."""
        detail = technical if technical is not None else str(exc)
        if isinstance(exc, (ModelFileError, ContextTooLargeError)):
            return cls(exc.message, detail, exc.kind)
        kind, message = explain(detail)
        if kind == KIND_OTHER and not isinstance(exc, (ValueError, RuntimeError, OSError)):
            message = "Loading the model failed unexpectedly. The technical details say what happened (for a report)."
        return cls(message, detail, kind)

    def as_text(self) -> str:
        return f"{self.message}{self.SEPARATOR}{self.detail}" if self.detail else self.message

    @classmethod
    def from_text(cls, text: str) -> LoadProblem:
        message, _sep, detail = text.partition(cls.SEPARATOR)
        return cls(message, detail)


_NO_BACKEND = ("The app's own llama.cpp libraries could not be loaded{where}, so no model can run; the model file is "
               "not at fault. Install the app again.")
# What to tell a person, by kind of problem.
_PLAIN = {
    KIND_MEMORY: "This PC ran out of memory loading the model. Close other programs, choose a smaller context, "
                 "or choose a smaller model.",
    KIND_ARCHITECTURE: "This model is of a kind (architecture) that this app's version of llama.cpp cannot run.",
    KIND_CRASHED: f"llama.cpp stopped while loading this file, so the file is most likely damaged. {DOWNLOAD_AGAIN}",
    KIND_TOO_SLOW: f"Loading this model took too long in a test run, so it was stopped; the file may be damaged. "
                   f"{DOWNLOAD_AGAIN}",
    KIND_DAMAGED: f"llama.cpp cannot load this file: something in it does not fit together. {DOWNLOAD_AGAIN}",
    KIND_NOT_INSTALLED: "The model that comes with the app is not installed. Open a model file instead "
                        "(File → Open model…).",
    KIND_UNREADABLE: "This file cannot be opened.",
    KIND_NO_BACKEND: _NO_BACKEND.format(where=""),
    KIND_OTHER: "This file could not be loaded as a model.",
}
# Technical texts that come without a kind, read back into one: llama.cpp's own refusals, and the load probe's
# verdicts as an older version cached them. (a phrase of the text, kind); first match wins.
_PHRASES = (
    (NO_BACKEND_PHRASE, KIND_NO_BACKEND),
    ("no backends are loaded", KIND_NO_BACKEND),  # llama.cpp's own words when a load finds none
    ("for lack of memory", KIND_MEMORY),
    ("failed to allocate", KIND_MEMORY),
    ("unknown model architecture", KIND_ARCHITECTURE),
    ("llama.cpp crashed", KIND_CRASHED),
    ("took longer than", KIND_TOO_SLOW),
    ("cannot load the model", KIND_DAMAGED),
    ("not installed", KIND_NOT_INSTALLED),
)


def plain_message(kind: str, detail: str = "") -> str:
    """What to tell a person about a problem of ``kind`` (``detail``: the technical text, for the names in it)."""
    if kind == KIND_NO_BACKEND:
        folder = re.search(NO_BACKEND_PHRASE + r" from (.+?)(?:: |$)", detail)
        if folder:
            return _NO_BACKEND.format(where=f" from {folder.group(1)}")
    if kind == KIND_ARCHITECTURE:
        named = re.search(r"unknown model architecture:? '([^']+)'", detail)
        if named:
            return (f"This model is of a kind (architecture \"{named.group(1)}\") that this app's version of "
                    "llama.cpp cannot run.")
    return _PLAIN.get(kind, _PLAIN[KIND_OTHER])


def problem_kind(detail: str, default: str = KIND_OTHER) -> str:
    """The kind of problem a technical text that came without one names (``default`` when none fits)."""
    lowered = detail.lower()
    return next((k for phrase, k in _PHRASES if phrase in lowered), default)


def explain(detail: str) -> tuple[str, str]:
    """(kind, plain sentence) for a technical text that came without a kind."""
    kind = problem_kind(detail)
    return kind, plain_message(kind, detail)


class ContextTooLargeError(SettingsError):
    """The requested context's KV cache would not fit in this machine's memory.

    ``str()`` is the technical text; ``message`` the plain one (as ``ModelFileError``'s).
    """

    kind = KIND_MEMORY

    def __init__(self, detail: str, message: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.message = message or (
            "This PC does not have enough free memory for a context this long. Choose a shorter context "
            "or close other programs."
        )
