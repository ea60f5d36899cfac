"""Draft proposals: where the next tokens may already have been seen.

Two sources, ranked together:
- the history (prompt, earlier turns and the reply so far): the longest
  earlier occurrence of the current context's last tokens, and what followed
  it there (prompt lookup). The match length says how much to trust it.
- the n-gram pool (Jacobi trajectories and history n-grams keyed by one
  token), for when the context has not occurred before.

Pure Python; testable without a model.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from .pool import NgramPool

MAX_MATCH = 32
SCAN = 16  # most recent occurrences of the context's last bigram to compare

# How the other earlier occurrences of the context continue at a draft token,
# among those that agreed with the draft up to it: mostly the same way, mostly
# not, or there are none. Where they part is usually where the text starts to
# differ (the next item of a list, the word an edit changes).
AGREE, ALONE, SPLIT = 1, 0, -1


@dataclass(frozen=True)
class Draft:
    """A proposed continuation of the last committed token.

    ``source`` is the kind of lookup that found it, which Auto keeps its
    acceptance statistics by: "history" (a suffix match in this reply's text
    and what came before it), "corpus" (a suffix match in earlier chats) or
    "pool" (an n-gram keyed by the last token alone). ``origin`` is where its
    tokens came from, for accounting: "prompt", "history", "reply",
    "other_chats", "window", "kept", …
    """

    tokens: tuple[int, ...]
    source: str
    match: int  # context tokens that matched (1 = only the last token)
    support: tuple[int, ...] = ()  # per token: AGREE, ALONE or SPLIT (missing = ALONE)
    origin: str = ""

    def support_at(self, k: int) -> int:
        return self.support[k] if k < len(self.support) else ALONE


class HistoryIndex:
    """Every token seen so far, indexed by bigram for suffix matching.

    Tokens are added in segments, each with the origin its drafts are
    accounted to (the history, the prompt, the reply so far).
    """

    source = "history"

    def __init__(self, max_positions: int = 64) -> None:
        self.tokens: list[int] = []
        self._index: dict[tuple[int, int], list[int]] = {}
        self.max_positions = max_positions
        self._segment_starts: list[int] = []
        self._segment_origins: list[str] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def origin_at(self, i: int) -> str:
        """The origin of the segment holding token ``i``."""
        k = bisect_right(self._segment_starts, i) - 1
        return self._segment_origins[k] if k >= 0 else ""

    def extend(self, tokens: Sequence[int], origin: str = "history") -> None:
        if not tokens:
            return
        if not self._segment_origins or self._segment_origins[-1] != origin:
            self._segment_starts.append(len(self.tokens))
            self._segment_origins.append(origin)
        toks = self.tokens
        for t in tokens:
            toks.append(int(t))
            i = len(toks) - 1
            if i >= 1:
                positions = self._index.setdefault((toks[i - 1], toks[i]), [])
                positions.append(i)
                if len(positions) > self.max_positions:
                    del positions[0]

    def _match_len(self, i: int, end: int) -> int:
        """How many tokens ending at i equal those ending at ``end`` (the context's last)."""
        toks = self.tokens
        m = 0
        while m < MAX_MATCH and i - m >= 0 and toks[i - m] == toks[end - m] and i - m != end - m:
            m += 1
        return m

    def propose(self, context_end_token: int, length: int, count: int = 2) -> list[Draft]:
        """Continuations of the longest earlier matches of the context (which ends with the history's last token).

        ``context_end_token`` is the last committed token; the history must
        end with it.
        """
        toks = self.tokens
        end = len(toks) - 1
        if end < 1 or toks[end] != context_end_token or length <= 0:
            return []
        positions = self._index.get((toks[end - 1], toks[end]), [])
        found: list[tuple[int, int]] = []  # (match, position)
        for i in positions[-SCAN - 1 :][::-1]:
            if i >= end:
                continue
            found.append((self._match_len(i, end), i))
        found.sort(key=lambda mi: (mi[0], mi[1]), reverse=True)
        conts = [tuple(toks[i + 1 : i + 1 + length]) for _, i in found]
        out: list[Draft] = []
        for k, (m, i) in enumerate(found):
            cont = conts[k]
            if not cont or any(d.tokens[: len(cont)] == cont for d in out):
                continue
            others = conts[:k] + conts[k + 1 :]
            out.append(Draft(cont, self.source, m, _support(cont, others), self.origin_at(i + 1)))
            if len(out) == count:
                break
        return out


def _support(cont: tuple[int, ...], others: list[tuple[int, ...]]) -> tuple[int, ...]:
    """AGREE/SPLIT/ALONE per token of ``cont``, against the continuations that agreed with it so far."""
    out = []
    live = others
    for k, tok in enumerate(cont):
        live = [o for o in live if len(o) > k]
        if not live:
            out.extend([ALONE] * (len(cont) - k))
            break
        same = [o for o in live if o[k] == tok]
        out.append(AGREE if 2 * len(same) >= len(live) else SPLIT)
        live = same
    return tuple(out)


def rank_drafts(history: HistoryIndex, pool: NgramPool, token: int, count: int, length: int) -> list[Draft]:
    """Up to ``count`` distinct drafts for what follows ``token``: history matches first, then the pool."""
    if count <= 0 or length <= 0:
        return []
    drafts = history.propose(token, length, count)
    if len(drafts) < count:
        for cont, origin in pool.ranked(token, count, length):
            if any(d.tokens[: len(cont)] == cont for d in drafts):
                continue
            drafts.append(Draft(cont, "pool", 1, origin=origin))
            if len(drafts) == count:
                break
    return drafts
