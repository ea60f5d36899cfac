"""Checks that the installed Qt binding is one the app can run on.

PySide6 6.12.0 on Python < 3.12 drops a reference to ``None`` on every call of
a method that returns nothing (and to ``True`` on every ``Signal.emit()``).
Python 3.12+ makes those objects immortal, which hides it; on 3.11 the app
aborts with "Fatal Python error: none_dealloc" after some thousands of calls,
i.e. minutes into a chat. 6.11.3 is fine. The check measures the behaviour
instead of trusting version numbers.
"""

from __future__ import annotations

import sys

_CALLS = 64


def binding_problem() -> str | None:
    """A message saying why this PySide6 cannot run the app, or None if it can."""
    import PySide6
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        ping = Signal()

    probe = _Probe()
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(_CALLS):
        probe.setObjectName("probe")
    for _ in range(_CALLS):
        probe.ping.emit()
    lost_none = none_before - sys.getrefcount(None)
    lost_true = true_before - sys.getrefcount(True)
    if lost_none >= _CALLS or lost_true >= _CALLS:
        return (
            f"PySide6 {PySide6.__version__} on Python {sys.version_info.major}.{sys.version_info.minor} "
            "loses a reference on every call (None/True refcount bug) and would crash the app; "
            "install another PySide6 (e.g. pip install 'pyside6<6.12') or use Python 3.12+."
        )
    return None
