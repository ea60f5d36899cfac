"""How often draft tokens land: a prior per kind of draft, moved by what lands while generating.

A draft token's chance to land (pk, auto.py) depends on how long a stretch of the context the draft's source
matched (every accepted token makes that match one longer, so later tokens of a draft that is landing are likelier
to land) and on whether the other earlier occurrences of the context continue the same way at that token. It is
learned per (source, match length, support, sure) while generating, starting from priors (``AcceptanceStats``),
and lasts across replies (the engine keeps one).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from engine.decoding.drafts import AGREE, ALONE, ENDING, ENDS_NOW, FORCED, GOES_ON, LIKELY, SPLIT, Draft
from engine.decoding.origins import DraftSource

# Match lengths are pooled in these buckets (a bucket holds lengths from its edge to the next).
MATCH_EDGES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24)

# Prior acceptance of a history draft's token by the length of the context match
# behind it (which grows by one with every accepted token) and by whether the
# other earlier occurrences of that context continue the same way: a longer match,
# and occurrences that agree, make the next token likelier to land. Read from
# greedy replies of a 135M instruct model, then shaded down a little (docs/SPEED.md,
# "The figures behind the code's constants"). Worth PRIOR_WEIGHT tokens; what
# lands while generating moves them.
_HISTORY_PRIORS = {
    support: dict(zip(MATCH_EDGES, priors, strict=True))
    for support, priors in (
        (ALONE, (0.35, 0.52, 0.6, 0.72, 0.75, 0.78, 0.8, 0.86, 0.89, 0.95, 0.96)),
        (AGREE, (0.6, 0.78, 0.83, 0.88, 0.9, 0.9, 0.93, 0.95, 0.95, 0.98, 0.99)),
        (SPLIT, (0.15, 0.2, 0.25, 0.45, 0.5, 0.4, 0.5, 0.5, 0.6, 0.6, 0.8)),
    )
}
# A short match in an earlier chat is mostly a coincidence: the same few tokens in another conversation say
# little about this one, and such drafts land far less often than a short match in the prompt or the reply does
# (docs/SPEED.md, "The figures behind the code's constants"). Longer matches take the history priors.
_CORPUS_SHORT_PRIORS = {
    ALONE: {1: 0.1, 2: 0.15, 3: 0.2},
    AGREE: {1: 0.25, 2: 0.35, 3: 0.5},
    SPLIT: {1: 0.1, 2: 0.1, 3: 0.15},
}
POOL_PRIOR = 0.2
# Text a grammar forces lands unless the model splits it into other tokens than the grammar's own.
GRAMMAR_PRIOR = 0.95
# The text a grammar forces, split alone, where the model may merge its end with what follows: the bundled model's
# replies to the extraction prompts began with that split at 146 of 160 such places (docs/SPEED.md, "The figures
# behind the code's constants").
LIKELY_PRIOR = 0.85
# Where a value copied into a grammar's string reaches the end of a clause, the string ends there (``ENDING``) or
# goes on (``GOES_ON``, a sentence's commas). Where a draft would end it at its first token (``ENDS_NOW``), no token
# of the value was copied yet to say the value is that text, and the string ends there far less often. Each observed
# draft fades every bucket a little, so a kind of guess seen once every few values is priced near its prior: these
# were measured on two models (docs/SPEED.md, "The figures behind the code's constants").
ENDING_PRIOR = 0.5
ENDS_NOW_PRIOR = 0.25
GOES_ON_PRIOR = 0.3
# An n-gram kept from earlier replies lands less often than one of this reply's pool, and more often after a token
# the model was sure of (docs/SPEED.md, "The figures behind the code's constants"). Its own prior keeps kept drafts
# from being verified as alternatives where a token more costs a fifth of a step; where it costs little, they still
# are.
KEPT_PRIORS = {False: 0.08, True: 0.12}
# The step that reads the prompt's last token (the chat template's own, a line break) finds n-grams of what
# followed that token elsewhere in the prompt, which is seldom how a reply starts: such drafts almost never land
# (docs/SPEED.md, "The figures behind the code's constants"). A prior this low keeps a model whose extra rows cost
# something from drafting there, while one whose rows cost next to nothing still does, and learns.
OPENING_PRIOR = 0.05
PRIOR_WEIGHT = 6.0
# A window column's yield: draft tokens that land later from its trajectory, per column and step, as the bundled
# model's windows earned on the repo workloads (docs/SPEED.md, "The figures behind the code's constants").
WINDOW_PRIOR = 0.04
WINDOW_PRIOR_COLUMNS = 40.0
WINDOW_DECAY = 0.995
# Each observed draft fades what was seen before it a little, so the estimates
# follow the kind of text being written now (a list, a copy, free prose).
DECAY = 0.95
MAX_P = 0.995
# (source, match edge, support, sure): ``sure`` says the model was sure of the token the draft follows
# (decoders.is_sure), as where text is copied or written by rote; drafts land more often there than in free writing.
Bucket = tuple[str, int, int, bool]
def match_bucket(m: int) -> int:
    return MATCH_EDGES[max(bisect_right(MATCH_EDGES, m) - 1, 0)]


def bucket(d: Draft, k: int = 0, sure: bool = False) -> Bucket:
    """The statistics bucket of draft token ``k`` (its match is the draft's plus the k tokens before it)."""
    return (d.source, match_bucket(d.match + k), d.support_at(k), sure)


# The grammar's text and the guesses about where a copied string ends are priced by their kind, whatever their source.
_GUESS_PRIORS = {FORCED: GRAMMAR_PRIOR, LIKELY: LIKELY_PRIOR, ENDING: ENDING_PRIOR, ENDS_NOW: ENDS_NOW_PRIOR,
                 GOES_ON: GOES_ON_PRIOR}


def _prior(b: Bucket) -> float:
    source, edge, support, sure = b
    if support in _GUESS_PRIORS:
        return _GUESS_PRIORS[support]
    if source == DraftSource.CORPUS and edge in _CORPUS_SHORT_PRIORS[support]:
        return _CORPUS_SHORT_PRIORS[support][edge]
    if source in (DraftSource.HISTORY, DraftSource.DOCUMENT, DraftSource.CORPUS, DraftSource.TEXT):
        return _HISTORY_PRIORS[support][edge]
    if source == DraftSource.KEPT:
        return KEPT_PRIORS[sure]
    if source == DraftSource.OPENING:
        return OPENING_PRIOR
    return POOL_PRIOR


@dataclass
class AcceptanceStats:
    """Acceptance of draft tokens, by source, match length and support (each token given the ones before it landed).

    Also what the Jacobi window earns: the draft tokens that landed from its
    trajectories, per window column run (they land in later steps, as pool drafts).
    """

    # Tokens accepted and tested per bucket, each in units of ``unit``: fading every bucket at once (each observed
    # draft does) shrinks the unit instead of touching every bucket.
    accepted: dict[Bucket, float] = field(default_factory=dict)
    tested: dict[Bucket, float] = field(default_factory=dict)
    window_tokens: float = 0.0
    window_columns: float = 0.0
    unit: float = 1.0

    def p(self, b: Bucket) -> float:
        """Estimated acceptance (prior blended with what was seen)."""
        a = self.accepted.get(b, 0.0) * self.unit + _prior(b) * PRIOR_WEIGHT
        t = self.tested.get(b, 0.0) * self.unit + PRIOR_WEIGHT
        return min(a / t, MAX_P)

    def observe(self, d: Draft, n_drafted: int, n_accepted: int, fade: bool = True, sure: bool = False) -> None:
        """A draft of ``n_drafted`` tokens had its first ``n_accepted`` accepted (``fade``: first of its step)."""
        if fade:
            self.unit *= DECAY
            if self.unit < 1e-100:  # back to a unit of 1 long before the counts could overflow
                for counts in (self.tested, self.accepted):
                    for b in counts:
                        counts[b] *= self.unit
                self.unit = 1.0
        one = 1.0 / self.unit
        # Tokens tested: the accepted ones plus the first rejected one, if any.
        for k in range(min(n_accepted + 1, n_drafted)):
            b = bucket(d, k, sure)
            self.tested[b] = self.tested.get(b, 0.0) + one
            self.accepted[b] = self.accepted.get(b, 0.0) + (one if k < n_accepted else 0.0)

    def window_gain(self) -> float:
        """Expected draft tokens one window column earns (prior blended with what was seen)."""
        return (self.window_tokens + WINDOW_PRIOR * WINDOW_PRIOR_COLUMNS) / (
            self.window_columns + WINDOW_PRIOR_COLUMNS
        )

    def observe_window(self, columns: int, landed: int) -> None:
        """A step ran ``columns`` window columns; ``landed`` draft tokens from earlier trajectories landed in it."""
        self.window_columns = self.window_columns * WINDOW_DECAY + columns
        self.window_tokens = self.window_tokens * WINDOW_DECAY + landed
