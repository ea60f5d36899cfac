"""Where DRY would turn a draft down, so that the draft stops there.

DRY (llama.cpp's "don't repeat yourself" sampler) lowers the logit of a token
that would extend a repeat of text the sampler has seen: if the last ``n``
tokens (none of them a sequence breaker) occurred before, followed by token
``t``, then ``t`` (unless it is a breaker itself) loses
``multiplier * base ** (n - allowed_length)`` once ``n`` reaches
``allowed_length``. Drafts that copy the reply's own earlier
text (its suffix matches, the pool of its n-grams) propose exactly those
tokens, and past a few tokens of repeat the penalty outweighs any lead the
model gave them: such a draft token is a batch row that will not be accepted.

``DryScreen`` follows the text DRY sees (the reply, and the prompt's tail when
DRY is given it) and says how much of a draft comes before the first token
DRY would lower by ``threshold`` or more. It only shortens drafts; what is
accepted is still decided by the sampler itself, so the text does not change.

Pure Python; testable without a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from engine.decoding.settings import SamplingConfig

# A draft stops before a token DRY would lower by this many logits: a lead that large is rare, and such tokens were
# nearly always turned down (docs/SPEED.md, "Drafts under DRY").
DRY_CUT = 5.0
MAX_REPEAT = 32  # repeats longer than this are penalised as this long: far past any threshold
MAX_POSITIONS = 64  # latest places of each trigram compared


class DryScreen:
    """The penalty DRY would give each token of a draft, from the tokens it has seen.

    ``is_breaker``: whether a token's text holds a sequence breaker (a repeat is not followed across them).
    """

    def __init__(
        self, is_breaker: Callable[[int], bool], multiplier: float, base: float, allowed_length: int,
        threshold: float,
    ) -> None:
        self._is_breaker = is_breaker
        self._multiplier = multiplier
        self._base = base
        self._allowed = max(1, allowed_length)
        self._threshold = threshold
        self._tokens: list[int] = []
        self._since_breaker = 0  # how many of the last tokens are not breakers
        self._index: dict[tuple[int, ...], list[int]] = {}  # the allowed-length tokens before a position, and it

    def extend(self, tokens: Sequence[int]) -> None:
        """Tokens DRY has now seen, in order."""
        for tok in tokens:
            tok = int(tok)
            self._tokens.append(tok)
            self._since_breaker = 0 if self._is_breaker(tok) else self._since_breaker + 1
            key = self._key(self._tokens, len(self._tokens) - 1)
            if key is not None:
                places = self._index.setdefault(key, [])
                places.append(len(self._tokens) - 1)
                if len(places) > MAX_POSITIONS:
                    del places[0]

    def penalty(self, n: int) -> float:
        """What DRY subtracts from a token that would extend a repeat of ``n`` tokens."""
        if n < self._allowed:
            return 0.0
        return self._multiplier * self._base ** (min(n, MAX_REPEAT) - self._allowed)

    def keep(self, draft: Sequence[int]) -> int:
        """How many of ``draft``'s tokens (which follow the tokens seen) come before the first one DRY would
        lower by the threshold or more."""
        return len(self._walk(draft, self._threshold))

    def penalties(self, draft: Sequence[int]) -> list[float]:
        """What DRY would subtract from each of ``draft``'s tokens, each drawn after the ones before it."""
        return self._walk(draft, math.inf)

    def _walk(self, draft: Sequence[int], stop: float) -> list[float]:
        """The penalties of ``draft``'s tokens in order, up to the first of ``stop`` or more (left out).

        The draft stands after the tokens seen for the walk only (no copy of the reply: this runs for every
        draft of every step), its own positions indexed as it goes, since a draft may repeat itself.
        """
        text, n_seen = self._tokens, len(self._tokens)
        text.extend(int(t) for t in draft)
        in_draft: dict[tuple[int, ...], list[int]] = {}
        out: list[float] = []
        since = self._since_breaker
        try:
            for end in range(n_seen, len(text)):
                if self._is_breaker(text[end]):  # DRY never lowers a breaker itself
                    penalty, since = 0.0, 0
                else:
                    penalty, since = self.penalty(self._repeat(text, end, since, in_draft)), since + 1
                if penalty >= stop:
                    break
                out.append(penalty)
                key = self._key(text, end)
                if key is not None:
                    in_draft.setdefault(key, []).append(end)
        finally:
            del text[n_seen:]
        return out

    def _key(self, text: Sequence[int], j: int) -> tuple[int, ...] | None:
        """The allowed-length tokens before position ``j`` and the token at it, if none is a breaker."""
        if j < self._allowed:
            return None
        before = tuple(text[j - self._allowed : j])
        if any(self._is_breaker(t) for t in before):
            return None
        return (*before, text[j])

    def _repeat(self, text: list[int], end: int, since: int, in_draft: dict[tuple[int, ...], list[int]]) -> int:
        """The longest repeat that ``text[end]`` would extend: how many tokens before ``end`` (at most ``since``,
        the breaker-free ones) also stand before an earlier ``text[end]`` (a seen one, or one of the draft's,
        ``in_draft``)."""
        limit = min(since, MAX_REPEAT)
        if limit < self._allowed:
            return 0
        key = self._key(text, end)
        if key is None:
            return 0
        best = 0
        for j in (*self._index.get(key, ()), *in_draft.get(key, ())):
            n = self._allowed
            while n < limit and j - 1 - n >= 0 and text[j - 1 - n] == text[end - 1 - n]:
                n += 1
            best = max(best, n)
        return best


def dry_screen(
    sampling: SamplingConfig, prompt: Sequence[int], is_breaker: Callable[[int], bool], threshold: float = DRY_CUT,
) -> DryScreen | None:
    """The screen of a reply written with ``sampling`` to ``prompt``: it sees what the sampler sees, the prompt's
    tail included (None: DRY is off)."""
    if not sampling.dry:
        return None
    screen = DryScreen(is_breaker, sampling.dry_multiplier, sampling.dry_base, sampling.dry_allowed_length, threshold)
    if sampling.prompt_tail:
        screen.extend(prompt[-sampling.prompt_tail :])
    return screen
