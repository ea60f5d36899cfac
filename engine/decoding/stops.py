"""Where a reply ends, and the text it shows as it grows.

A reply ends at an end-of-generation token, at the token with which it starts to loop (loops.py; under a grammar,
closed there so that it still parses), at max_tokens, or at the token that completes a stop string; its text is
shown as its tokens come, never splitting a UTF-8 character nor showing what may be the start of a stop string.
``ReplyEnd`` reads committed tokens one by one, in order, so that every decoder stops at the same token and shows
the same text.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

from engine.decoding.loops import LoopGuard
from engine.decoding.settings import StopConfig
from engine.llama.native import Model


class ReplyEnd:
    """Committed tokens to the reply's tokens and shown text: cut where the reply ends, UTF-8 safe, end-of-generation
    tokens hidden, stop strings cut.

    ``close(unkept, limit)``: the tokens that end a reply stopped at a loop where it must still be whole (under a
    grammar, ``GrammarState.close_now``), given how many committed tokens it does not keep and how many it may
    still add."""

    def __init__(self, model: Model, stop: StopConfig, prompt: Sequence[int],
                 close: Callable[[int, int], list[int]] | None = None) -> None:
        self._is_eog = model.is_eog
        self._close = close
        self._max_tokens = stop.max_tokens
        self._loop_guard = LoopGuard(prompt, piece=model.token_bytes) if stop.loop_guard else None
        self._stream = TextStream(model.token_bytes)
        self._stops = StopMatcher(stop.stop_strings)
        self._n_kept = 0  # the reply's tokens so far

    def cut(self, committed: Sequence[int]) -> tuple[list[int], list[str], str | None]:
        """What the reply keeps of a step's ``committed`` tokens, the text each adds ("" while a character's bytes
        or a possible stop string are held back), and why the reply ends there (None: it goes on)."""
        kept, reason = self._limits(committed)
        pieces, hit_at = self._feed(kept)
        if hit_at is not None:  # the reply ends with the token that completed a stop string, as in plain decoding
            kept, pieces, reason = kept[: hit_at + 1], pieces[: hit_at + 1], "stop_string"
        elif reason and pieces:
            pieces[-1] += self.finish()
        self._n_kept += len(kept)
        return kept, pieces, reason

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the reply (None: none did)."""
        return self._stops.matched

    def finish(self) -> str:
        """The text held back, at the reply's end."""
        piece, _ = self._stops.push(self._stream.flush())
        return piece + self._stops.flush()

    def _limits(self, committed: Sequence[int]) -> tuple[list[int], str | None]:
        """Cut ``committed`` after an end-of-generation token, the token with which the reply loops, or at
        max_tokens, saying which."""
        out: list[int] = []
        guard = self._loop_guard
        for tok in committed:
            out.append(tok)
            if self._is_eog(tok):
                return out, "eog"
            if guard is not None and guard.push(tok):
                if self._close is not None:
                    out += self._close(len(committed) - len(out), self._max_tokens - self._n_kept - len(out))
                return out, "loop"
            if self._n_kept + len(out) >= self._max_tokens:
                return out, "max_tokens"
        return out, None

    def _feed(self, tokens: Sequence[int]) -> tuple[list[str], int | None]:
        """The text each token adds, and the index of the token that completed a stop string (None: none did)."""
        pieces = []
        for k, tok in enumerate(tokens):
            piece, hit = ("", False) if self._is_eog(tok) else self._stops.push(self._stream.feed(tok))
            pieces.append(piece)
            if hit:
                return pieces, k
        return pieces, None


class TextStream:
    """Turns token ids into text deltas, never splitting a UTF-8 character.

    Bytes of a character split across tokens are held until it is complete.
    """

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(self._token_bytes(token))

    def flush(self) -> str:
        """End of the stream: an incomplete trailing character is dropped, not shown as U+FFFD."""
        self._decoder.reset()
        return ""


class StopMatcher:
    """Finds stop strings in streamed text and holds back what might start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.text = ""  # everything released so far
        self.matched: str | None = None  # the stop string found (the earliest in the text; the first given at a tie)

    def push(self, delta: str) -> tuple[str, bool]:
        """Returns (text safe to show now, whether a stop string was hit)."""
        if not self.stops:
            self.text += delta
            return delta, False
        buf = self._held + delta
        # The stop may straddle the boundary: search the held tail too.
        hits = [(buf.find(s), s) for s in self.stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            i, self.matched = min(hits, key=lambda hit: hit[0])
            out = buf[:i]
            self._held = ""
            self.text += out
            return out, True
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        out = buf[: len(buf) - keep]
        self._held = buf[len(buf) - keep :]
        self.text += out
        return out, False

    def flush(self) -> str:
        out, self._held = self._held, ""
        self.text += out
        return out
