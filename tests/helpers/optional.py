"""Values the code under test may return as None, where a test expects one to be there."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None) -> T:
    """``value``, failing the test where it is None (``store.message(i)``, a Qt getter that may return nothing)."""
    assert value is not None, "expected a value, got None"
    return value
