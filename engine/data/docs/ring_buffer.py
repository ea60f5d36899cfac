"""A fixed-size ring buffer of numbers, with the running mean of what it holds."""

from __future__ import annotations


class RingBuffer:
    """Keeps the last ``capacity`` values pushed; the oldest is dropped when it is full."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._values: list[float] = [0.0] * capacity
        self._start = 0
        self._count = 0
        self._total = 0.0

    def __len__(self) -> int:
        return self._count

    def push(self, value: float) -> float | None:
        """Add ``value``; return the value it pushed out, or None while the buffer was not full."""
        dropped = None
        if self._count == self.capacity:
            dropped = self._values[self._start]
            self._total -= dropped
            self._values[self._start] = value
            self._start = (self._start + 1) % self.capacity
        else:
            self._values[(self._start + self._count) % self.capacity] = value
            self._count += 1
        self._total += value
        return dropped

    def pop(self) -> float:
        """Remove and return the oldest value."""
        if self._count == 0:
            raise IndexError("pop from an empty ring buffer")
        value = self._values[self._start]
        self._start = (self._start + 1) % self.capacity
        self._count -= 1
        self._total -= value
        return value

    def mean(self) -> float:
        """The mean of the values held (0.0 when empty)."""
        return self._total / self._count if self._count else 0.0

    def values(self) -> list[float]:
        """The values held, oldest first."""
        return [self._values[(self._start + i) % self.capacity] for i in range(self._count)]
