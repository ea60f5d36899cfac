"""Draft proposals: where the next tokens may already have been seen.

Suffix matches, then n-grams (``DraftSources`` ranks them together):
- the history (prompt, earlier turns and the reply so far): the longest
  earlier occurrence of the current context's last tokens, and what followed
  it there (prompt lookup). The match length says how much to trust it.
- the documents attached to the chat (a ``CorpusIndex`` of their whole text,
  the parts left out of the prompt too), then earlier chats with the same
  model (another ``CorpusIndex``): the same lookup over their text.
- the n-gram pool (Jacobi trajectories and history n-grams keyed by one
  token), and the pool kept from earlier replies (kept.py), for when the
  context has not occurred before.

Pure Python; testable without a model.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from engine.decoding.origins import DraftOrigin, DraftSource
from engine.decoding.pool import NgramPool

MAX_MATCH = 32
SCAN = 16  # most recent occurrences of the context's last bigram to compare

# How the other earlier occurrences of the context continue at a draft token,
# among those that agreed with the draft up to it: mostly the same way, mostly
# not, or there are none. Where they part is usually where the text starts to
# differ (the next item of a list, the word an edit changes).
AGREE, ALONE, SPLIT = 1, 0, -1
FORCED = 2  # a token the reply's grammar leaves no choice about (whatever the other occurrences say)
ENDING = 3  # the quote a copied draft ends a grammar's string with where its text ends a clause (a guess)
GOES_ON = 4  # the same draft's clause end where it runs on instead (the other guess)
LIKELY = 5  # text a grammar forces, in the tokens it splits into alone, where the model may merge its end (a guess)
ENDS_NOW = 6  # the same quote at a draft's first token, where nothing of the value was copied yet (a weaker guess)


@dataclass(frozen=True)
class Draft:
    """A proposed continuation of the last committed token.

    ``source`` is the kind of lookup that found it (a DraftSource), which Auto
    keeps its acceptance statistics by; ``origin`` is where its tokens came
    from (a DraftOrigin), for accounting.
    """

    tokens: tuple[int, ...]
    source: str
    match: int  # context tokens that matched (1 = only the last token)
    support: tuple[int, ...] = ()  # per token: AGREE, ALONE or SPLIT (missing = ALONE)
    origin: str = ""

    def support_at(self, k: int) -> int:
        return self.support[k] if k < len(self.support) else ALONE

    def leading(self, kind: int) -> int:
        """How many of the first tokens have support ``kind``."""
        return next((k for k, s in enumerate(self.support) if s != kind), len(self.support))


class HistoryIndex:
    """Every token seen so far, indexed by bigram for suffix matching.

    Tokens are added in segments, each with the origin its drafts are
    accounted to (the history, the prompt, the reply so far).
    """

    source: str = DraftSource.HISTORY

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

    def extend(self, tokens: Sequence[int], origin: str = DraftOrigin.HISTORY) -> None:
        if not tokens:
            return
        if not self._segment_origins or self._segment_origins[-1] != origin:
            self._segment_starts.append(len(self.tokens))
            self._segment_origins.append(origin)
        toks = self.tokens
        for t in tokens:
            toks.append(int(t))
            if len(toks) >= 2:
                _index_last_pair(self._index, toks, self.max_positions)

    def continuation(self, tokens: Sequence[int], length: int) -> Draft | None:
        """What followed the longest earlier match of the history's text with ``tokens`` after it (tokens not
        in the history yet: the text a grammar forces next), up to ``length`` tokens; None if nothing did."""
        text = self.tokens
        if length <= 0 or not tokens or len(text) + len(tokens) < 2:
            return None
        ahead = [*text[-1:], *tokens]
        best_m, best_i = 0, -1
        for i in self._index.get((ahead[-2], ahead[-1]), [])[-SCAN:][::-1]:
            m = 0
            while m < MAX_MATCH and i - m >= 0 and text[i - m] == _from_end(text, tokens, m):
                m += 1
            if m > best_m:
                best_m, best_i = m, i
        following = tuple(text[best_i + 1 : best_i + 1 + length]) if best_i >= 0 else ()
        return Draft(following, self.source, best_m, origin=self.origin_at(best_i + 1)) if following else None

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
        found.sort(reverse=True)
        conts = [tuple(toks[i + 1 : i + 1 + length]) for _, i in found]
        return _distinct_drafts(found, conts, count, self.source, lambda i: self.origin_at(i + 1))


def _from_end(text: Sequence[int], tokens: Sequence[int], m: int) -> int | None:
    """The token ``m`` places from the end of ``text`` followed by ``tokens`` (None before the start)."""
    if m < len(tokens):
        return tokens[-1 - m]
    k = len(text) - 1 - (m - len(tokens))
    return text[k] if k >= 0 else None


def _index_last_pair(index: dict[tuple[int, int], list[int]], toks: list[int], max_positions: int) -> None:
    """Index the bigram that ends at ``toks``' last token, keeping its ``max_positions`` latest positions."""
    i = len(toks) - 1
    positions = index.setdefault((toks[i - 1], toks[i]), [])
    positions.append(i)
    if len(positions) > max_positions:
        del positions[0]


def _distinct_drafts(
    found: list[tuple[int, int]],
    conts: list[tuple[int, ...]],
    count: int,
    source: str,
    origin_of: Callable[[int], str],
) -> list[Draft]:
    """Up to ``count`` drafts from matches ``found`` (match, position), best first, and their continuations
    ``conts``: each with its support among the others, none a prefix of one taken before it."""
    out: list[Draft] = []
    for k, (m, i) in enumerate(found):
        cont = conts[k]
        if not cont or any(d.tokens[: len(cont)] == cont for d in out):
            continue
        out.append(Draft(cont, source, m, support_among(cont, conts[:k] + conts[k + 1 :]), origin_of(i)))
        if len(out) == count:
            break
    return out


def support_among(cont: tuple[int, ...], others: list[tuple[int, ...]]) -> tuple[int, ...]:
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


class CorpusIndex:
    """Earlier chats with this model: suffix matches of the current context in their text.

    Bounded: past ``max_tokens`` the oldest half is dropped. Texts are kept apart
    by a separator no draft runs across. Fed between generations (see Engine.remember_chat).
    """

    SEPARATOR = -1

    def __init__(
        self, max_tokens: int = 100_000, max_positions: int = 16,
        source: str = DraftSource.CORPUS, origin: str = DraftOrigin.OTHER_CHATS,
    ) -> None:
        """``source``: the bucket Auto keeps its acceptance in; ``origin``: what accepted drafts are counted as
        (earlier chats: CORPUS, OTHER_CHATS; attached documents: DOCUMENT, DOCUMENT)."""
        self.source = source
        self.origin = origin
        self.max_tokens = max_tokens
        self.max_positions = max_positions
        self._tokens: list[int] = []
        self._index: dict[tuple[int, int], list[int]] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, tokens: Sequence[int]) -> None:
        """One more text (a chat's messages, in order)."""
        if len(tokens) < 2:
            return
        if len(self._tokens) + len(tokens) + 1 > self.max_tokens:
            keep = self._tokens[len(self._tokens) // 2 :] if len(tokens) < self.max_tokens // 2 else []
            self._tokens, self._index = [], {}
            self._append(keep)
        self._append([int(t) for t in tokens[-self.max_tokens + 1 :]] + [self.SEPARATOR])

    def _append(self, tokens: Sequence[int]) -> None:
        toks = self._tokens
        for t in tokens:
            toks.append(t)
            if len(toks) >= 2 and t != self.SEPARATOR and toks[-2] != self.SEPARATOR:
                _index_last_pair(self._index, toks, self.max_positions)

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (two or more) occur in the corpus as they are, at one of their first bigram's
        latest ``max_positions`` places."""
        if len(tokens) < 2:
            return False
        want, toks = list(tokens), self._tokens
        return any(toks[i - 1 : i - 1 + len(want)] == want for i in self._index.get((want[0], want[1]), ()))

    def propose(self, context: Sequence[int], length: int, count: int = 1) -> list[Draft]:
        """Continuations of the corpus's longest matches of ``context``'s last tokens (its last is the input)."""
        if len(context) < 2 or length <= 0:
            return []
        toks = self._tokens
        found: list[tuple[int, int]] = []  # (match, position)
        for i in self._index.get((context[-2], context[-1]), ())[::-1][:SCAN]:
            m = 2
            while m < MAX_MATCH and m < len(context) and i - m >= 0 and toks[i - m] == context[-1 - m]:
                m += 1
            found.append((m, i))
        found.sort(reverse=True)
        conts: list[tuple[int, ...]] = []
        for _, i in found:
            following = toks[i + 1 : i + 1 + length]
            if self.SEPARATOR in following:
                following = following[: following.index(self.SEPARATOR)]
            conts.append(tuple(following))
        return _distinct_drafts(found, conts, count, self.source, lambda _i: self.origin)


class DraftScreen(Protocol):
    """What cuts a draft short: ``keep`` says how many of its tokens (which follow the reply so far) to verify."""

    def keep(self, tokens: tuple[int, ...]) -> int: ...


class TextMatch(Protocol):
    """The history's text matched where its tokens are not (text_match.TextIndex)."""

    def continuation(self, length: int) -> tuple[tuple[int, ...], int, int, tuple[int, ...]] | None: ...


class ForcedText(Protocol):
    """Text the next tokens must be (a grammar's), as up to ``limit`` tokens; () when there is a choice."""

    def forced(self, limit: int) -> tuple[int, ...]: ...

    def likely(self, limit: int) -> tuple[int, ...]: ...

    def ending(self, tokens: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None: ...


class DraftCorpus(Protocol):
    """Text to draft from by suffix match, as ``CorpusIndex`` offers it (or replay.py's recorded reply)."""

    source: str
    origin: str

    def holds(self, tokens: Sequence[int]) -> bool: ...

    def propose(self, context: Sequence[int], length: int, count: int = 1) -> list[Draft]: ...


@dataclass
class DraftSources:
    """Where a step's drafts may come from, best first: suffix matches, then n-grams keyed by the last token."""

    history: HistoryIndex  # this reply's prompt, the history given with it and the reply so far
    pool: NgramPool  # this reply's n-grams and the Jacobi window's trajectories
    corpus: CorpusIndex | None = None  # earlier chats with this model
    kept: NgramPool | None = None  # n-grams kept from earlier replies of this model
    documents: DraftCorpus | None = None  # the chat's attached documents, whole
    # What cuts drafts short: DRY where it would turn a token down, a grammar where it forbids one (dry.py,
    # grammar.py).
    screens: tuple[DraftScreen, ...] = ()
    forced: ForcedText | None = None  # what a grammar forces next, drafted first
    text: TextMatch | None = None  # the history's text, where no tokens match

    def _keep(self, tokens: tuple[int, ...]) -> int:
        """How many of ``tokens`` come before the first one a screen cuts."""
        keep = len(tokens)
        for screen in self.screens:
            keep = min(keep, screen.keep(tokens[:keep])) if keep else 0
        return keep

    def _screened(self, drafts: list[Draft]) -> list[Draft]:
        """``drafts`` cut by the screens; those with nothing left dropped."""
        out = []
        for d in drafts:
            keep = self._keep(d.tokens)
            if keep == len(d.tokens):
                out.append(d)
            elif keep > 0:
                out.append(replace(d, tokens=d.tokens[:keep], support=d.support[:keep]))
        return out

    def matches(self, token: int, length: int, count: int) -> list[Draft]:
        """Suffix-match drafts: this reply's history first, then the attached documents, then earlier chats.

        A draft copied from the prompt whose text is an attached document's (the part of it given in the
        prompt) is counted as the document's.
        """
        drafts = self.history.propose(token, length, count) or self._text_match(length)
        if self.documents is not None:
            before = self.history.tokens[-1:]
            drafts = [replace(d, origin=self.documents.origin)
                      if d.origin == DraftOrigin.PROMPT and self.documents.holds([*before, *d.tokens]) else d
                      for d in drafts]
        for corpus in (self.documents, self.corpus):
            if corpus is None or len(drafts) >= count + 1:
                continue
            for d in corpus.propose(self.history.tokens, length, 1):
                if not any(o.tokens[: len(d.tokens)] == d.tokens for o in drafts):
                    drafts.append(d)
        drafts = [e for d in self._screened(drafts) for e in self._ended(d)]
        if self.forced is None:
            return drafts
        forced = self.forced.forced(length)
        lead = forced + self.forced.likely(length - len(forced))
        if lead:  # the grammar's text first; a draft that holds it and goes on stays an alternative
            longer = [d for d in drafts if not (len(d.tokens) <= len(lead) and lead[: len(d.tokens)] == d.tokens)]
            drafts = [self._after_forced(lead, len(forced), length), *longer]
        return drafts

    def _ended(self, d: Draft) -> list[Draft]:
        """A copied draft inside a string of the grammar that runs on past the end of a clause: ended there too,
        first (the quote there is the model's likely choice, and the text the grammar forces after it comes
        with it); the draft as it was stays an alternative, for a value that goes on."""
        found = self.forced.ending(d.tokens) if self.forced is not None else None
        if found is None:
            return [d]
        at, closing = found
        before = tuple(d.support_at(k) for k in range(at))
        support = before + (ENDING if at else ENDS_NOW,) + (FORCED,) * (len(closing) - 1)
        goes_on = before + (GOES_ON,) + tuple(d.support_at(k) for k in range(at + 1, len(d.tokens)))
        return [replace(d, tokens=d.tokens[:at] + closing, support=support), replace(d, support=goes_on)]

    def _text_match(self, length: int) -> list[Draft]:
        """The history's text where its tokens do not match the context (a word copied after a quote)."""
        found = self.text.continuation(length) if self.text is not None else None
        if found is None:
            return []
        tokens, match, at, support = found
        return [Draft(tokens, DraftSource.TEXT, match, support, self.history.origin_at(at))]

    def _after_forced(self, lead: tuple[int, ...], n_forced: int, length: int) -> Draft:
        """The text a grammar forces (its first ``n_forced`` tokens given, the rest ``LIKELY``), then what followed
        that text where the history held it before (a value copied from the prompt after a key the schema
        forces): one draft."""
        support = (FORCED,) * n_forced + (LIKELY,) * (len(lead) - n_forced)
        grammar = Draft(lead, DraftSource.GRAMMAR, MAX_MATCH, support, DraftOrigin.GRAMMAR)
        after = self.history.continuation(lead, length - len(lead))
        if after is None:
            return grammar
        keep = self._keep((*lead, *after.tokens)) - len(lead)  # the screens judge it after the forced text
        if keep <= 0:
            return grammar
        # Priced as the history match it is (its forced tokens as forced): ``match`` counts the forced text too.
        return replace(grammar, tokens=lead + after.tokens[:keep], source=after.source, match=after.match,
                       support=grammar.support + (ALONE,) * keep)

    def ngrams(
        self, token: int, count: int, length: int, taken: Sequence[Draft] = (), reply: bool = True, kept: bool = True,
    ) -> list[Draft]:
        """Up to ``count`` n-gram drafts not already covered by ``taken``: this reply's pool (``reply``), then the
        kept one (``kept``), each draft with its pool as its source."""
        out: list[Draft] = []
        for pool, source, wanted in ((self.pool, DraftSource.POOL, reply), (self.kept, DraftSource.KEPT, kept)):
            if pool is None or not wanted or len(out) >= count:
                continue
            for cont, origin in pool.ranked(token, count, length):
                cont = cont[: self._keep(cont)]
                if not cont or any(d.tokens[: len(cont)] == cont for d in (*taken, *out)):
                    continue
                out.append(Draft(cont, source, 1, origin=origin))
                if len(out) == count:
                    break
        return out

    def rank(self, token: int, count: int, length: int) -> list[Draft]:
        """Up to ``count`` distinct drafts for what follows ``token``, best first."""
        if count <= 0 or length <= 0:
            return []
        drafts = self.matches(token, length, count)[:count]
        return drafts + self.ngrams(token, count - len(drafts), length, drafts)
