"""A way to the end of a JSON grammar from where a reply stands: how a reply about to reach its token limit, or
stopped by the loop guard, is closed so that it still parses (grammar.GrammarState, ``max_tokens``).

The way is found by a simple rule, not a search: take what the grammar forces; inside a string, end it; else
close the innermost object or array; else start the least value there is (an empty string, a 0); else go on
to the next item the grammar requires; else take the allowed token of the lowest id (an enum's first value).
On a JSON schema's grammar this reaches the end in a few tokens for every key still required; on another
grammar it may not, and then the reply is not closed.
"""

from __future__ import annotations

import llguidance
import numpy as np

from engine.llama.native import Model

MAX_CLOSE = 64  # the longest way looked for; a reply further from its grammar's end than this is not closed
# Tried in this order where the grammar leaves a choice (after ending a string, which comes first).
_CLOSERS = ("}", "]", '"', "0", ",")


class Closer:
    """The ways to a grammar's end for one model's vocabulary (single-character tokens, the end tokens)."""

    def __init__(self, model: Model) -> None:
        single = {ch: model.text_tokens(ch) for ch in (*_CLOSERS, "a")}
        self._tokens = {ch: toks[0] for ch, toks in single.items() if len(toks) == 1}
        self._ends = [t for t in (model.eos(), model.eot()) if t >= 0]
        self._tokenize = model.text_tokens

    def way_to_end(self, matcher: llguidance.LLMatcher) -> list[int] | None:
        """The tokens from ``matcher``'s state to the grammar's end, the end-of-text token last; None where the
        rule finds none within MAX_CLOSE tokens. ``matcher`` is left as it was."""
        m = matcher.deep_copy()
        way: list[int] = []
        while len(way) < MAX_CLOSE:
            if m.is_accepting():
                end = next((t for t in self._ends if m.validate_tokens([t]) == 1), None)
                return [*way, end] if end is not None else way
            tok = self._next(m)
            if tok is None or not m.consume_token(tok):
                return None
            way.append(tok)
        return None

    def _next(self, m: llguidance.LLMatcher) -> int | None:
        forced = m.compute_ff_tokens()
        if forced:
            return int(forced[0])
        text = m.compute_ff_bytes()  # forced text that may still join what follows into another token (` "`)
        if text:
            first = self._tokenize(text.decode("utf-8", "replace"))[:1]
            if first and m.validate_tokens(first) == 1:
                return first[0]
        allowed = {ch: t for ch, t in self._tokens.items() if m.validate_tokens([t]) == 1}
        if '"' in allowed and "a" in allowed:  # a letter may follow: inside a string
            return allowed['"']
        found = next((allowed[ch] for ch in _CLOSERS if ch in allowed), None)
        return found if found is not None else _first_allowed(m)


def _first_allowed(m: llguidance.LLMatcher) -> int | None:
    """The allowed token of the lowest id (the start of an enum's value, say)."""
    bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
    found = np.flatnonzero(bits)
    return int(found[0]) if len(found) else None
