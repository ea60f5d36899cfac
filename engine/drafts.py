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
    tokens: tuple[int, ...]
    source: str  # "history" | "pool"
    match: int  # context tokens that matched (1 = only the last token)
    support: tuple[int, ...] = ()  # per token: AGREE, ALONE or SPLIT (missing = ALONE)

    def support_at(self, k: int) -> int:
        return self.support[k] if k < len(self.support) else ALONE


class HistoryIndex:
    """Every token seen so far, indexed by bigram for suffix matching."""

    def __init__(self, max_positions: int = 64) -> None:
        self.tokens: list[int] = []
        self._index: dict[tuple[int, int], list[int]] = {}
        self.max_positions = max_positions

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
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
        for k, (m, _) in enumerate(found):
            cont = conts[k]
            if not cont or any(d.tokens[: len(cont)] == cont for d in out):
                continue
            others = conts[:k] + conts[k + 1 :]
            out.append(Draft(tokens=cont, source="history", match=m, support=_support(cont, others)))
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
        for cont in pool.candidates(token, count, length):
            if any(d.tokens[: len(cont)] == cont for d in drafts):
                continue
            drafts.append(Draft(tokens=cont, source="pool", match=1))
            if len(drafts) == count:
                break
    return drafts
