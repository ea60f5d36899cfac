"""The n-gram pool kept across replies and chats of one model, on disk.

Each reply's pool (its own n-grams, the Jacobi window's trajectories and the
hits drafts scored) is merged into one pool per model file, which the next
reply drafts from (origin "kept"). Bounded, and stored in the user cache dir
under a key of the model file's path, size and modification time: a changed
or replaced file starts an empty pool. Nothing leaves the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from engine.decoding.origins import DraftOrigin
from engine.decoding.pool import NgramPool
from engine.decoding.settings import MAX_NGRAM
from engine.files import cache_root, file_identity, write_json_atomic

KEPT_VERSION = 1
MAX_ENTRIES = 60_000  # about 5 MB of JSON
CAPACITY = 8  # continuations per key
KEEP_ORIGINS = frozenset({DraftOrigin.REPLY, DraftOrigin.WINDOW})


def kept_dir() -> Path:
    return cache_root() / "ngrams"


def model_key(model_path: str | os.PathLike[str]) -> str:
    """The model file's identity: a file changed in place or replaced gets another key."""
    ident = f"v{KEPT_VERSION}|{file_identity(model_path)}"
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def empty() -> NgramPool:
    return NgramPool(max_len=MAX_NGRAM - 1, capacity=CAPACITY)


def load(model_path: str | os.PathLike[str]) -> NgramPool:
    """The pool kept for this model file (empty if none, or unreadable)."""
    try:
        path = kept_dir() / f"{model_key(model_path)}.json"
        obj = json.loads(path.read_text(encoding="utf-8"))
        if obj.get("version") != KEPT_VERSION:
            return empty()
        return NgramPool.from_json(obj["entries"], MAX_NGRAM - 1, CAPACITY, DraftOrigin.KEPT)
    except (OSError, ValueError, KeyError, TypeError):
        return empty()


def save(model_path: str | os.PathLike[str], pool: NgramPool) -> None:
    """Write the pool for this model file (atomically; a read-only cache dir only loses it)."""
    try:
        d = kept_dir()
        d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(d / f"{model_key(model_path)}.json", {"version": KEPT_VERSION, "entries": pool.to_json()})
    except OSError:
        pass


def keep(kept: NgramPool, reply_pool: NgramPool) -> None:
    """Merge a finished reply's pool into the kept one: its own n-grams, the window's, and every verified one."""
    kept.merge(reply_pool, KEEP_ORIGINS, DraftOrigin.KEPT)
    if len(kept) > MAX_ENTRIES * 1.1:  # trimmed in batches: ranking every entry takes a tenth of a second
        kept.trim(MAX_ENTRIES)
