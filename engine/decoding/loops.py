"""The loop guard: a reply that has started repeating itself is stopped, as a stop string would stop it.

A small model decoding greedily can fall into a cycle ("not only not only not only …") that it never leaves. The
guard reads the reply's tokens one by one, in order, so plain decoding and lookahead (which commits several tokens
a step) stop at the same token and their texts stay identical. The reply is looping when its tail is one span of
``period`` tokens over and over: at least ``MIN_REPEATS`` times and ``MIN_LOOP_TOKENS`` tokens in all.

Repeating what the reply was given is copying, not looping. A tail that stands in the prompt as it is (a quoted
refrain) does not stop the reply; and where the prompt itself repeats a span of about that length (a table of
like rows, a song's chorus), the reply may repeat one as often as the prompt did, and is stopped once past that,
even when it changed the span on the way (a column added to every row).

Told each token's text, the guard counts every token of spaces alone as the same token: DRY, which lowers a
token that would repeat a span, turns such a loop into rows that differ only in how many spaces pad them.

The thresholds come from replies measured both ways (docs/SPEED.md, "The loop guard").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

MAX_PERIOD = 64  # the longest repeated span looked for, in tokens (a sentence or two)
MIN_REPEATS = 4  # times a span must follow itself
LONG_SPAN = 16  # a span this long or longer (a sentence) is a loop one repeat sooner
MIN_LOOP_TOKENS = 24  # and the repetition's length in tokens (a word over and over is not stopped at its 4th time)
SPACES = -1  # what every token of spaces alone counts as: one row of empty cells padded on, row after row, is a loop


class LoopGuard:
    """Watches a reply's tokens for a tail that repeats one span; ``push`` says when it does.

    ``context`` is what the reply may copy (the prompt, with any documents in it): a repeated tail found there too
    is not a loop. Each token costs O(MAX_PERIOD): per period, how many tokens in a row equal the one a period back.
    """

    def __init__(self, context: Sequence[int], max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS,
                 min_tokens: int = MIN_LOOP_TOKENS, long_span: int = LONG_SPAN,
                 piece: Callable[[int], bytes] | None = None) -> None:
        self._piece = piece
        self._context = [self._like(t) for t in context]
        self._max_period = max_period
        self._min_tokens = min_tokens
        self._reply: list[int] = []
        self._runs = [0] * (max_period + 1)  # _runs[p]: tokens in a row equal to the one p tokens before
        shown = context_repeats(self._context, 2 * max_period)
        # _allowed[p]: the repeats of a span of p tokens that are not yet a loop: more than the prompt shows of
        # a span half to twice as long
        self._allowed = [0] + [max(min_repeats - (p >= long_span), 1 + max(shown[max(1, p // 2) : 2 * p + 1]))
                               for p in range(1, max_period + 1)]

    def push(self, token: int) -> bool:
        """Add the reply's next token; True if the reply now ends in a loop."""
        reply = self._reply
        reply.append(self._like(token))
        n = len(reply)
        looping = False
        for p in range(1, min(self._max_period, n - 1) + 1):
            if reply[-1] == reply[-1 - p]:
                self._runs[p] += 1
                length = self._runs[p] + p  # the tail of this length has period p
                if not looping and length >= max(self._allowed[p] * p, self._min_tokens):
                    looping = not _contains(self._context, reply[n - length :])
            else:
                self._runs[p] = 0
        return looping

    def _like(self, token: int) -> int:
        """``token``, or SPACES for a token of spaces alone (with ``piece``, its text)."""
        if self._piece is None:
            return token
        text = self._piece(token)
        return SPACES if text and not text.strip(b" \t") else token


def context_repeats(context: Sequence[int], max_period: int) -> list[int]:
    """``out[p]``: how many times in a row the context repeats some span of ``p`` tokens (1 where it never does)."""
    out = [1] * (max_period + 1)
    tokens = np.asarray(context, dtype=np.int64)
    for p in range(1, min(max_period, len(tokens) - 1) + 1):
        same = tokens[p:] == tokens[:-p]
        if not same.any():
            continue
        # the longest run of True: positions where a run starts and ends
        edges = np.flatnonzero(np.diff(np.concatenate(([0], same.view(np.int8), [0]))))
        longest = int((edges[1::2] - edges[0::2]).max())
        out[p] = (longest + p) // p
    return out


def _contains(haystack: list[int], needle: list[int]) -> bool:
    """Whether ``needle`` is a contiguous run of ``haystack``."""
    m = len(needle)
    if m == 0:
        return True
    first = needle[0]
    start = 0
    while True:
        try:
            i = haystack.index(first, start, len(haystack) - m + 1)
        except ValueError:
            return False
        if haystack[i : i + m] == needle:
            return True
        start = i + 1


def reads_as_a_loop(text: str) -> bool:
    """A reader's rule, which does not share the guard's method: a run of 6 words that comes 4 or more times, or
    one word or character over and over. Benchmarks count a reply it flags as looped, stopped or not."""
    words = text.split()
    grams = Counter(tuple(words[i : i + 6]) for i in range(len(words) - 5))
    if grams and max(grams.values()) >= 4:
        return True
    return bool(re.search(r"(\S+)(\s+\1){7,}", text) or re.search(r"(.)\1{19,}", text))
