"""Batching of fast updates into at most ~30 repaints a second."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal, Slot

DEFAULT_INTERVAL_MS = 33  # ~30 Hz: smooth to the eye, cheap for the event loop


class UpdateCoalescer(QObject):
    """Collects items as they arrive and hands them over in batches, at most once per interval.

    The engine reports every forward pass (hundreds a second with a fast
    model); redrawing the Markdown and the chart for each would freeze the
    window, so the owner redraws once per batch instead.

    Signals:
        flushed(list): the items collected since the last batch, in arrival order.
    """

    flushed = Signal(list)

    def __init__(self, interval_ms: int = DEFAULT_INTERVAL_MS, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._items: list[object] = []
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.setSingleShot(True)  # armed by the first item after a flush: idle costs nothing
        self._timer.timeout.connect(self._on_timeout)

    def push(self, item: object) -> None:
        self._items.append(item)
        if not self._timer.isActive():
            self._timer.start()

    def pending(self) -> int:
        return len(self._items)

    def flush(self) -> None:
        """Hand over what is pending now (e.g. before the final stats line)."""
        self._timer.stop()
        if self._items:
            items, self._items = self._items, []
            self.flushed.emit(items)

    def clear(self) -> None:
        self._timer.stop()
        self._items = []

    @Slot()
    def _on_timeout(self) -> None:
        self.flush()
