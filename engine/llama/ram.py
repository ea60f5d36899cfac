"""Whether a context fits in this PC's free RAM: the KV cache of the attention layers and the states of
the recurrent ones, against what the OS (or the container's cgroup) says is available.
"""

from __future__ import annotations

from pathlib import Path

import psutil

from engine.llama.models import GgufSummary
from engine.llama.problems import ContextTooLargeError
from engine.units import plain_size

CGROUP_DIR = Path("/sys/fs/cgroup")  # cgroup v2 as a container sees its own group (tests point it elsewhere)


def available_ram_bytes() -> int | None:
    """Memory this process can still use: the system's available memory, capped by a cgroup limit (None if unknown).

    psutil reads it on Linux (MemAvailable), macOS and Windows alike.
    """
    try:
        avail = int(psutil.virtual_memory().available)
    except (OSError, psutil.Error):
        return None
    try:  # cgroup v2: a container's limit can be far below the machine's memory
        limit = (CGROUP_DIR / "memory.max").read_text().strip()
        used = int((CGROUP_DIR / "memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def check_context_fits(summary: GgufSummary, n_ctx: int, available: int | None = None) -> None:
    """Refuse a context whose KV cache cannot fit in memory, before llama.cpp tries to allocate it.

    Linux overcommits: an allocation larger than free memory may succeed and get the process
    killed when the cache is cleared, so the estimate is checked here instead.
    """
    need = summary.kv_cache_bytes(n_ctx)
    avail = available_ram_bytes() if available is None else available
    if not need or avail is None or need <= avail:
        return
    # Half the free memory, less what does not grow with the context; a round number.
    per_token = summary.kv_bytes_per_token
    fits = (max(avail // 2 - summary.kv_cache_bytes(0), 0) // per_token) // 256 * 256 if per_token else 0
    if summary.context_length:
        fits = min(fits, summary.context_length)  # more than the model was trained on is of no use
    hint = f"choose a context of at most {fits} tokens"
    plain_hint = f"Choose a context of at most {fits:,} tokens (Context in the side panel)."
    if fits < 256:
        hint = "close other programs or choose a smaller model"
        plain_hint = "Close other programs or choose a smaller model."
    raise ContextTooLargeError(
        f"a context of {n_ctx} tokens is more than this machine's memory allows: its cache would need "
        f"{plain_size(need)} and {plain_size(avail)} is available; {hint}",
        f"This PC does not have enough free memory for a context of {n_ctx:,} tokens: the model would need "
        f"{plain_size(need)} for it and {plain_size(avail)} is free. {plain_hint}",
    )
