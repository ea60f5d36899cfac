"""Replayed drafts: lookahead's speed on a model whose text no draft source can predict.

A model with random weights (engine/tools/shapes.py) runs at a real model's speed but writes noise, so the prompt,
earlier chats and documents offer it no draft that lands, and asking it to copy text does not make it copy.
A replay measures what drafts would be worth anyway: plain decoding's reply to a prompt is recorded first,
then at each position of the reply a ``ReplayDrafts`` offers the recorded continuation, right with
probability ``right`` (drawn once per position, seeded) and wrong from its first token otherwise. The engine
verifies these as it verifies any draft (one decode, the rejected tail dropped or taken back), Auto sizes and
learns them like the drafts of an attached document, and the text stays plain decoding's: only which drafts
exist is scripted, what they cost is the model's own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from engine.decoding.drafts import Draft
from engine.decoding.origins import DraftOrigin, DraftSource

# The suffix match every replayed draft claims: a long one, so that Auto starts from a document draft's
# confident prior and has to learn, from what lands, what these drafts are worth.
REPLAY_MATCH = 8


class ReplayDrafts:
    """Drafts from a recorded reply, for ``DraftSources.documents`` (the same calls as a ``CorpusIndex``)."""

    source: str = DraftSource.DOCUMENT  # Auto keeps its acceptance with an attached document's
    origin: str = DraftOrigin.REPLAY

    def __init__(self, prompt: Sequence[int], reply: Sequence[int], right: float, n_vocab: int, seed: int = 0):
        if not 0.0 <= right <= 1.0:
            raise ValueError(f"the share of right drafts must be between 0 and 1, not {right}")
        self.prompt = list(prompt)
        self.reply = list(reply)
        self.right = right
        self.n_vocab = n_vocab
        self.seed = seed

    def is_right(self, pos: int) -> bool:
        """Whether the draft offered at reply position ``pos`` is the recorded text (the same every time asked)."""
        return random.Random(self.seed * 1_000_003 + pos).random() < self.right

    def holds(self, tokens: Sequence[int]) -> bool:
        return False  # no part of the prompt is this "document"'s text

    def propose(self, context: Sequence[int], length: int, count: int = 1) -> list[Draft]:
        """The recorded continuation of ``context`` (prompt + reply so far), when the reply so far is the
        recorded one; its first token changed where this position's draft is to be wrong."""
        n = len(self.prompt)
        pos = len(context) - n
        if length <= 0 or not 0 <= pos < len(self.reply) or list(context[n:]) != self.reply[:pos]:
            return []
        cont = self.reply[pos : pos + length]
        if not self.is_right(pos):
            first = cont[0] + 1 if cont[0] + 1 < self.n_vocab else cont[0] - 1
            cont = [first, *cont[1:]]
        return [Draft(tuple(cont), self.source, REPLAY_MATCH, origin=self.origin)]
