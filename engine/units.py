"""Quantities and names as people read them: the one way the engine and the app write a size or a parameter
count, and the string enum the engine names its kinds of things with."""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A string enum that prints as its value (``enum.StrEnum`` from Python 3.11): a value read back from a saved
    chat, a cache or a JSON report compares equal to its member."""

    def __str__(self) -> str:
        return str(self.value)


def plain_size(n_bytes: int) -> str:
    """A size as people say it, in powers of 1000 (what file managers show): 5 MB, 98 MB, 1.2 GB."""
    if n_bytes < 1000:
        return f"{n_bytes} bytes"
    for unit, scale in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        value = n_bytes / scale
        if value < 1000 or unit == "TB":
            shown = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
            return f"{shown} {unit}"
    return f"{n_bytes} bytes"  # not reached


def format_params(n: int) -> str:
    """A parameter count as people write it: 135M, 8.0B ("" when unknown)."""
    if n <= 0:
        return ""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"
