"""The n-gram pool: draft continuations keyed by the token they follow.

Two sources fill it: Jacobi trajectories harvested from the lookahead window,
and the prompt and chat history (prompt lookup). Both land in the same pool and
are ranked the same way, by how often they were verified and how recently they
were seen. Pure Python; no model needed to use or test it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.decoding.origins import DraftOrigin


@dataclass
class _Entry:
    origin: str  # who added it first (a DraftOrigin)
    hits: int = 0
    last_seen: int = 0


class NgramPool:
    """Up to ``capacity`` continuations per first token, each at most ``max_len`` long.

    When a key is full the entry that is least useful (fewest hits, then
    oldest) is evicted.
    """

    def __init__(self, max_len: int, capacity: int = 32) -> None:
        if max_len < 1 or capacity < 1:
            raise ValueError("max_len and capacity must be >= 1")
        self.max_len = max_len
        self.capacity = capacity
        self._entries: dict[int, dict[tuple[int, ...], _Entry]] = {}
        self._clock = 0

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()
        self._clock = 0

    def add(self, key: int, continuation: Sequence[int], origin: str = DraftOrigin.UNKNOWN, hits: int = 0) -> None:
        """Record that ``continuation`` was seen right after ``key`` (``origin``: where, if it is new;
        ``hits``: verified that often elsewhere, when it comes from another pool)."""
        cont = tuple(map(int, continuation[: self.max_len]))
        if not cont:
            return
        self._clock += 1
        bucket = self._entries.setdefault(int(key), {})
        entry = bucket.get(cont)
        if entry is None:
            if len(bucket) >= self.capacity:
                worst = min(bucket.items(), key=lambda kv: (kv[1].hits, kv[1].last_seen))[0]
                del bucket[worst]
            entry = bucket[cont] = _Entry(origin)
        entry.last_seen = self._clock
        entry.hits = max(entry.hits, hits)

    def add_tokens(self, tokens: Sequence[int], start: int = 0, origin: str = DraftOrigin.UNKNOWN) -> None:
        """Add the n-grams of a token sequence whose first token is at ``start`` or later.

        Continuations shorter than ``max_len`` near the end are added too, so a
        freshly read prompt is useful at once.
        """
        n = len(tokens)
        for i in range(max(start, 0), n - 1):
            self.add(tokens[i], tokens[i + 1 : i + 1 + self.max_len], origin)

    def merge(self, other: NgramPool, origins: frozenset[str], origin: str) -> None:
        """Take ``other``'s entries that came from ``origins`` or were verified, as ``origin``, hits kept."""
        for key, bucket in other._entries.items():
            for cont, entry in bucket.items():
                if entry.hits or entry.origin in origins:
                    self.add(key, cont, origin, entry.hits)

    def trim(self, max_entries: int) -> None:
        """Keep the ``max_entries`` most useful entries (most hits, then most recently seen)."""
        if len(self) <= max_entries:
            return
        ranked = sorted(
            ((e.hits, e.last_seen, key, cont) for key, bucket in self._entries.items() for cont, e in bucket.items()),
            reverse=True,
        )
        for _, _, key, cont in ranked[max_entries:]:
            bucket = self._entries[key]
            del bucket[cont]
            if not bucket:
                del self._entries[key]

    def to_json(self) -> list[list]:
        """[key, continuation, hits] per entry, oldest first (``from_json`` restores the order of recency)."""
        rows = [(e.last_seen, key, list(cont), e.hits) for key, b in self._entries.items() for cont, e in b.items()]
        return [[key, cont, hits] for _, key, cont, hits in sorted(rows)]

    @classmethod
    def from_json(cls, rows: list, max_len: int, capacity: int, origin: str) -> NgramPool:
        pool = cls(max_len, capacity)
        for key, cont, hits in rows:
            pool.add(int(key), cont, origin, int(hits))
        return pool

    def observe_accepted(self, key: int, accepted: Sequence[int]) -> None:
        """Credit the entries of ``key`` whose continuation starts with ``accepted``."""
        if not accepted:
            return
        prefix = tuple(int(t) for t in accepted)
        bucket = self._entries.get(int(key))
        if not bucket:
            return
        k = len(prefix)
        for cont, entry in bucket.items():
            if cont[:k] == prefix[: len(cont)]:
                entry.hits += 1

    def candidates(self, key: int, count: int, length: int) -> list[tuple[int, ...]]:
        """The ``count`` best distinct continuations of ``key``, cut to ``length`` tokens (see ``ranked``)."""
        return [cont for cont, _ in self.ranked(key, count, length)]

    def ranked(self, key: int, count: int, length: int) -> list[tuple[tuple[int, ...], str]]:
        """The ``count`` best distinct continuations of ``key``, cut to ``length`` tokens, with their origins.

        Best first: most verified hits, then most recently seen. A continuation
        that is a prefix of a better-ranked one adds nothing and is skipped; one
        that extends a better-ranked one takes its place (the tree shares the prefix).
        """
        if count <= 0 or length <= 0:
            return []
        bucket = self._entries.get(int(key))
        if not bucket:
            return []
        ranked = sorted(bucket.items(), key=lambda kv: (kv[1].hits, kv[1].last_seen), reverse=True)
        out: list[tuple[tuple[int, ...], str]] = []
        for cont, entry in ranked:
            cut = cont[:length]
            if any(c[: len(cut)] == cut for c, _ in out):
                continue
            for k, (c, _) in enumerate(out):
                if cut[: len(c)] == c:
                    out[k] = (cut, entry.origin)
                    break
            else:
                if len(out) < count:
                    out.append((cut, entry.origin))
        return out
