"""Drafts from the history's text where its tokens do not match: the same words, split into other tokens.

A word the prompt has after a space (`` Lena``) is another token when the reply writes it after a quote, a
bracket or at a line's start (``"Lena``), so the token-level suffix match (drafts.HistoryIndex) finds nothing
where a value is being copied into JSON, a list item or a code string. ``TextIndex`` matches the end of the
reply's text against the history's text instead, and tokenizes what followed there as a draft. A generation
under a grammar uses it (generation.py): in free text the token matches find the copies.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

from engine.decoding.drafts import HistoryIndex, support_among

MAX_CHARS = 64  # the longest end of the reply's text matched
SHORT = 4  # a match this short must also start a word where the reply's does
SPAN = 96  # the most bytes of the history's text a draft takes
TRIES = 16  # earlier occurrences of the match looked at
OTHERS = 8  # of those, the most besides the latest that a draft's support is read from


class TextIndex:
    """The history's text (``history``'s tokens as bytes), searched for the end of the reply's text."""

    def __init__(self, history: HistoryIndex, piece: Callable[[int], bytes],
                 tokenize: Callable[[str], list[int]]) -> None:
        """``piece``: a token's text as bytes (b"" for control tokens); ``tokenize``: text to tokens, no BOS."""
        self._history = history
        self._piece = piece
        self._tokenize = tokenize
        self._text = bytearray()
        self._ends: list[int] = []  # where each token's text ends in ``_text``

    def continuation(self, length: int) -> tuple[tuple[int, ...], int, int, tuple[int, ...]] | None:
        """What followed the latest earlier occurrence of the longest end of the text, as up to ``length``
        tokens, with how many of the text's last tokens lie wholly in the match, the token that holds the
        continuation's first byte, and each token's support among the other occurrences (drafts.AGREE, SPLIT or
        ALONE, as a token match's); None when nothing matched."""
        self._catch_up()
        text, n = self._text, len(self._text)
        if length <= 0 or n < 2:
            return None
        size = _longest_suffix(text, n)
        if size == 0:
            return None
        found = self._occurrences(size)
        if not found:
            return None
        tokens = self._tokens_at(found[0] + size)[:length]
        if not tokens:
            return None
        support = self._support(tokens, [at + size for at in found[1:]])
        return tuple(tokens), self._tokens_within(n - size), self._token_at(found[0] + size), support

    def _catch_up(self) -> None:
        tokens = self._history.tokens
        for t in tokens[len(self._ends):]:
            self._text += self._piece(t)
            self._ends.append(len(self._text))

    def _occurrences(self, size: int) -> list[int]:
        """Where the earlier occurrences of the text's last ``size`` bytes start, latest first (at most
        OTHERS + 1, from the latest TRIES).

        A short match counts only where it starts a word as the reply's end does (the ``K`` of ``"Klinik``, not
        of ``OK``)."""
        text, n = self._text, len(self._text)
        end = text[n - size:]
        word = size < SHORT and n > size and _word_start(text, n - size)
        found: list[int] = []
        at = text.rfind(end, 0, n - 1)
        for _ in range(TRIES):
            if at < 0 or len(found) > OTHERS:
                break
            if not word or _word_start(text, at):
                found.append(at)
            at = text.rfind(end, 0, at + size - 1)
        return found

    def _support(self, tokens: list[int], others: list[int]) -> tuple[int, ...]:
        """Per token of a draft, how the continuations that start at bytes ``others`` go on there (a token match's
        rule, drafts.support_among): each other continuation read as the draft's token where its bytes are that
        token's, and as none (-1) where they differ, up to the end of the text."""
        text, n = self._text, len(self._text)
        spans, offset = [], 0
        for tok in tokens:
            piece = self._piece(tok)
            spans.append((tok, offset, piece))
            offset += len(piece)
        conts = [tuple(tok if text[c + at : c + at + len(piece)] == piece else -1
                       for tok, at, piece in spans if c + at + len(piece) <= n) for c in others]
        return support_among(tuple(tokens), conts)

    def _tokens_at(self, start: int) -> list[int]:
        """The history's text from byte ``start`` on, as tokens: the rest of the word ``start`` falls in,
        tokenized (empty where its bytes are not whole characters), then the history's own tokens from the next
        one that starts with a space, as far as SPAN bytes and not past a control token.

        A tokenizer splits text at spaces before it merges, so from there on the history's tokens are the ones
        the text's split would give; only the word's rest needs the tokenizer, a short text."""
        ends, history = self._ends, self._history.tokens
        first = bisect_right(ends, start)  # the token that holds byte ``start``
        limit = start + SPAN
        after = first + 1  # the first token of the history's own that the draft takes
        while after < len(ends) and ends[after - 1] < limit and not self._piece(history[after]).startswith(b" "):
            after += 1
        try:
            head = bytes(self._text[start : min(ends[after - 1], limit)]).decode("utf-8")
        except UnicodeDecodeError:
            return []
        tokens = self._tokenize(head) if head else []
        for k in range(after, len(ends)):
            if ends[k] > limit or not self._piece(history[k]):
                break
            tokens.append(history[k])
        return tokens

    def _tokens_within(self, start: int) -> int:
        """How many of the last tokens begin at or after byte ``start`` (at least one)."""
        ends, k = self._ends, 0
        while k + 1 < len(ends) and ends[-2 - k] >= start:
            k += 1
        return max(k, 1)

    def _token_at(self, byte: int) -> int:
        """The index of the token whose text holds byte ``byte``."""
        return bisect_right(self._ends, byte)


def _longest_suffix(text: bytearray, n: int) -> int:
    """The most of the text's last bytes (up to MAX_CHARS) that also occur ending earlier; 0 if not even one.

    Every end of a repeated end repeats too, so the length is found by halving."""
    lo, hi = 0, min(MAX_CHARS, n - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.find(text[n - mid:], 0, n - 1) >= 0:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _word_start(text: bytearray | Sequence[int], i: int) -> bool:
    """Whether byte ``i`` starts a word: the byte before it is not a letter or digit."""
    return i == 0 or not (chr(text[i - 1]).isalnum() or text[i - 1] >= 0x80)
