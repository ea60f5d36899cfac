from engine.decoding.drafts import AGREE, ALONE, FORCED, LIKELY, SPLIT, CorpusIndex, DraftSources, HistoryIndex
from engine.decoding.origins import DraftOrigin
from engine.decoding.pool import NgramPool


def test_history_proposes_the_continuation_of_the_longest_earlier_match():
    h = HistoryIndex()
    #          0  1  2  3  4  5  6  7  8  9 10 11
    h.extend([1, 2, 3, 9, 7, 2, 3, 4, 5, 6, 2, 3])
    drafts = h.propose(3, length=3)
    # Context ends "... 6 2 3"; both earlier "2 3" match 2 tokens; the more recent one wins the tie.
    assert drafts[0].tokens == (4, 5, 6) and drafts[0].match == 2
    assert drafts[1].tokens == (9, 7, 2)


def test_a_longer_match_beats_a_more_recent_one():
    h = HistoryIndex()
    h.extend([8, 2, 3, 50, 51, 0, 2, 3, 60, 61, 8, 2, 3])
    drafts = h.propose(3, length=2)
    assert drafts[0].tokens == (50, 51) and drafts[0].match == 3


def test_no_proposal_when_the_history_does_not_end_with_the_token():
    h = HistoryIndex()
    h.extend([1, 2, 3])
    assert h.propose(7, length=2) == []


def test_pool_fills_in_when_the_history_has_no_match():
    h = HistoryIndex()
    h.extend([5, 6, 7])
    pool = NgramPool(max_len=3)
    pool.add(7, [1, 2, 3])
    drafts = DraftSources(h, pool).rank(7, count=2, length=3)
    assert [(d.tokens, d.source) for d in drafts] == [((1, 2, 3), "pool")]



def test_a_kept_n_gram_is_drafted_as_the_kept_pool_s_and_either_pool_can_be_left_out():
    h = HistoryIndex()
    h.extend([5, 6, 7])
    pool, kept = NgramPool(max_len=3), NgramPool(max_len=3)
    pool.add(7, [1, 2, 3], DraftOrigin.PROMPT)
    kept.add(7, [8, 9], DraftOrigin.REPLY)
    sources = DraftSources(h, pool, kept=kept)
    assert [(d.tokens, d.source) for d in sources.ngrams(7, 2, 3)] == [((1, 2, 3), "pool"), ((8, 9), "kept")]
    assert [d.source for d in sources.ngrams(7, 2, 3, kept=False)] == ["pool"]
    assert [d.source for d in sources.ngrams(7, 2, 3, reply=False)] == ["kept"]


def test_support_says_where_earlier_occurrences_part_ways():
    h = HistoryIndex()
    # "2 3" was followed by "4 5 6", "4 5 7" and "4 8": all agree on 4, then two of three go on with 5.
    h.extend([2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 7, 0, 2, 3, 4, 8, 0, 2, 3])
    d = h.propose(3, length=3, count=1)[0]
    assert d.tokens == (4, 8, 0)
    # The draft follows the latest occurrence: the other two agree on 4 and both go on with 5, not 8.
    assert d.support == (AGREE, SPLIT, ALONE)
    assert d.support_at(7) == ALONE


def test_a_single_earlier_occurrence_has_no_support_either_way():
    h = HistoryIndex()
    h.extend([1, 2, 3, 9, 7, 1, 2, 3])
    d = h.propose(3, length=2, count=1)[0]
    assert d.tokens == (9, 7) and d.match == 3
    assert d.support == (ALONE, ALONE)


def test_drafts_say_which_text_their_tokens_came_from():
    h = HistoryIndex()
    h.extend([1, 2, 3, 4], "history")
    h.extend([9, 9, 5, 6, 7], "prompt")
    h.extend([5, 6], "reply")
    (d,) = h.propose(6, length=2, count=1)
    assert (d.tokens, d.origin) == ((7, 5), "prompt")  # the origin of its first token
    h.extend([1, 2], "reply")
    assert [(d.tokens, d.origin) for d in h.propose(2, length=3)] == [((3, 4, 9), "history")]
    pool = NgramPool(max_len=2)
    pool.add(5, [1, 2], "window")
    pool.add(5, [1, 2], "reply")  # seen again: it still counts for the window, which found it first
    pool.add(5, [3], "kept")
    assert pool.ranked(5, 2, 2) == [((3,), "kept"), ((1, 2), "window")]


def test_an_attached_document_drafts_where_the_context_is_not_in_the_history_and_owns_prompt_copies_of_it():
    documents = CorpusIndex(source="document", origin="document")
    documents.add([40, 41, 42, 43, 44, 45])
    h = HistoryIndex()
    h.extend([1, 2, 41, 42], "prompt")  # the question; the document's passage 41 42 … is not in it beyond this
    (d,) = DraftSources(h, NgramPool(max_len=3), documents=documents).matches(42, length=3, count=1)
    assert (d.tokens, d.source, d.origin) == ((43, 44, 45), "document", "document")
    # The passage is in the prompt too (it fitted): the prompt's copy is found first, and counted as the document's.
    h2 = HistoryIndex()
    h2.extend([41, 42, 43, 44, 45, 7, 41, 42], "prompt")
    drafts = DraftSources(h2, NgramPool(max_len=3), documents=documents).matches(42, length=3, count=1)
    assert (drafts[0].tokens, drafts[0].source, drafts[0].origin) == ((43, 44, 45), "history", "document")
    h3 = HistoryIndex()
    h3.extend([41, 42, 9, 9, 7, 41, 42], "prompt")  # a prompt text the document does not hold stays the prompt's
    assert DraftSources(h3, NgramPool(max_len=3), documents=documents).matches(42, 3, 1)[0].origin == "prompt"
    assert documents.holds([42, 43, 44]) and not documents.holds([42, 44]) and not documents.holds([42])


class _Forces:
    """A grammar that forces ``tokens`` next, then text split alone as ``likely``, and allows anything but
    ``banned``."""

    def __init__(self, tokens: tuple[int, ...], banned: int = -1, likely: tuple[int, ...] = ()) -> None:
        self.tokens, self.banned, self.then = tokens, banned, likely

    def forced(self, limit: int) -> tuple[int, ...]:
        return self.tokens[:limit]

    def likely(self, limit: int) -> tuple[int, ...]:
        return self.then[: max(limit, 0)]

    def keep(self, tokens: tuple[int, ...]) -> int:
        return tokens.index(self.banned) if self.banned in tokens else len(tokens)

    def ending(self, tokens: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
        return None


def test_the_text_a_grammar_forces_is_drafted_first_and_goes_on_as_the_history_went_on_after_it():
    h = HistoryIndex()
    # the prompt holds "name : Ada Lovelace ," ; the reply so far is "{" and the grammar forces "name :"
    h.extend([40, 41, 42, 43, 44, 45, 9, 99, 7], DraftOrigin.PROMPT)
    grammar = _Forces((41, 42))
    sources = DraftSources(h, NgramPool(max_len=3), screens=(grammar,), forced=grammar)
    (first, *_) = sources.matches(7, length=6, count=2)
    assert first.tokens == (41, 42, 43, 44, 45, 9)
    assert first.support[:2] == (FORCED, FORCED) and first.origin == DraftOrigin.GRAMMAR
    # where the grammar forbids what followed before, the draft stops there; with no earlier match, only the
    # forced text is drafted
    grammar.banned = 44
    assert sources.matches(7, length=6, count=2)[0].tokens == (41, 42, 43)
    alone = DraftSources(h, NgramPool(max_len=3), screens=(grammar,), forced=_Forces((70, 71)))
    assert alone.matches(7, length=6, count=2)[0].tokens == (70, 71)


def test_text_a_grammar_forces_past_its_own_tokens_is_drafted_as_a_guess_and_copies_go_on_after_it():
    h = HistoryIndex()
    # the prompt holds "name : ' Ada Lovelace ," ; the grammar gives "name :" and forces the bytes of "'" too,
    # which the model may merge with the value's first letters
    h.extend([40, 41, 42, 43, 44, 45, 9, 99, 7], DraftOrigin.PROMPT)
    both = DraftSources(h, NgramPool(max_len=3), forced=_Forces((41, 42), likely=(43,)))
    first = both.matches(7, length=6, count=2)[0]
    assert first.tokens == (41, 42, 43, 44, 45, 9) and first.support == (FORCED, FORCED, LIKELY, ALONE, ALONE, ALONE)
    # with no token given, the guess alone leads
    guess = DraftSources(h, NgramPool(max_len=3), forced=_Forces((), likely=(42, 43)))
    drafts = guess.matches(41, length=4, count=2)
    assert drafts[0].tokens == (42, 43, 44, 45) and drafts[0].support == (LIKELY, LIKELY, ALONE, ALONE)
    assert drafts[0].leading(FORCED) == 0  # no row of it goes without logits
