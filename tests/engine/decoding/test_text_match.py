"""Drafts from the history's text where its tokens differ (engine/decoding/text_match.py), and copied drafts
ended where a grammar's string likely ends (DraftSources, ``ending``). Pure: a toy vocabulary of words."""

from __future__ import annotations

from engine.decoding.drafts import AGREE, ALONE, ENDING, ENDS_NOW, FORCED, GOES_ON, SPLIT, DraftSources, HistoryIndex
from engine.decoding.origins import DraftOrigin, DraftSource
from engine.decoding.pool import NgramPool
from engine.decoding.text_match import TextIndex

VOCAB = {0: "", 1: " Lena", 2: " Fischer", 3: ",", 4: " works", 5: '"', 6: "Lena", 7: " Kiel", 8: " OK", 9: "K",
         10: "iel", 11: '",', 12: " next", 13: "Le", 14: "na"}  # 0: a control token, no text


def _piece(token: int) -> bytes:
    return VOCAB[token].encode()


def _tokenize(text: str) -> list[int]:
    """Longest word of the vocabulary first, as a tokenizer would."""
    by_length = sorted(((t, w) for t, w in VOCAB.items() if w), key=lambda kv: -len(kv[1]))
    out = []
    while text:
        tok, word = next((t, w) for t, w in by_length if text.startswith(w))
        out.append(tok)
        text = text[len(word):]
    return out


def _index(prompt: list[int], reply: list[int]) -> tuple[HistoryIndex, TextIndex]:
    history = HistoryIndex()
    history.extend(prompt, DraftOrigin.PROMPT)
    history.extend(reply, DraftOrigin.REPLY)
    return history, TextIndex(history, _piece, _tokenize)


def test_a_word_copied_after_a_quote_drafts_what_followed_it_in_the_prompt():
    # the prompt has " Lena Fischer, works"; the reply so far is '"Lena': no token of it is the prompt's
    history, text = _index([1, 2, 3, 4], [5, 6])
    assert history.propose(6, length=3) == []
    found = text.continuation(3)
    assert found is not None
    tokens, match, at, support = found
    assert tokens == (2, 3, 4) and support == (ALONE, ALONE, ALONE)  # the word occurs once
    assert match == 1 and history.origin_at(at) == DraftOrigin.PROMPT


def test_a_text_drafts_tokens_say_how_the_other_occurrences_of_the_word_go_on():
    # " Lena Fischer, works" and, earlier, " Lena Fischer works" and " Lena Kiel": after '"Lena' the latest
    # occurrence drafts " Fischer , works"; of the two others one has " Fischer" (agree: 1 of 2), and it then
    # goes on with " works", not ","
    history, text = _index([1, 2, 4, 12, 1, 7, 12, 1, 2, 3, 4], [5, 6])
    found = text.continuation(3)
    assert found is not None
    tokens, _, _, support = found
    assert tokens == (2, 3, 4)
    assert support == (AGREE, SPLIT, ALONE)


def test_a_short_match_counts_only_where_it_starts_a_word_as_the_replys_does():
    # '"K' matches the K of " Kiel", not the later one inside " OK"
    _, text = _index([7, 8], [5, 9])
    found = text.continuation(2)
    assert found is not None and found[0] == (10, 8)


def test_only_the_rest_of_the_matched_word_is_tokenized_and_the_prompts_own_tokens_follow_it():
    # '"Le' matches inside " Lena": "na" is split by the tokenizer, then " Fischer , works" are the prompt's own
    # tokens, up to the control token after them
    history = HistoryIndex()
    history.extend([1, 2, 3, 4, 0, 12], DraftOrigin.PROMPT)
    history.extend([5, 13], DraftOrigin.REPLY)
    asked: list[str] = []

    def tokenize(text: str) -> list[int]:
        asked.append(text)
        return _tokenize(text)

    text = TextIndex(history, _piece, tokenize)
    found = text.continuation(8)
    assert found is not None and found[0] == (14, 2, 3, 4)
    assert asked == ["na"]


def test_nothing_is_drafted_where_the_text_never_occurred():
    _, text = _index([12], [5])
    assert text.continuation(3) is None


class _String:
    """A grammar inside a string: a draft ends before its first ``,`` token with '",' and the forced ``next``."""

    def forced(self, limit: int) -> tuple[int, ...]:
        return ()

    def likely(self, limit: int) -> tuple[int, ...]:
        return ()

    def keep(self, tokens: tuple[int, ...]) -> int:
        return len(tokens)

    def ending(self, tokens: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
        return (tokens.index(3), (11, 12)) if 3 in tokens else None


def test_a_copied_draft_in_a_string_is_ended_at_its_clause_end_and_kept_as_it_was_beside():
    history, text = _index([1, 2, 3, 4], [5, 6])
    sources = DraftSources(history, NgramPool(max_len=3), screens=(_String(),), forced=_String(), text=text)
    ended, goes_on = sources.matches(6, length=3, count=2)
    assert ended.tokens == (2, 11, 12) and ended.support == (ALONE, ENDING, FORCED)
    assert goes_on.tokens == (2, 3, 4) and goes_on.support[1] == GOES_ON
    assert ended.source == goes_on.source == DraftSource.TEXT


def test_a_copy_whose_next_token_ends_a_clause_is_ended_at_once_as_a_guess_of_its_own():
    # the reply's '"Lena Fischer' ends as the prompt's " Lena Fischer", whose next token is the clause's ","
    history, text = _index([1, 2, 3, 4], [5, 6, 2])
    sources = DraftSources(history, NgramPool(max_len=3), screens=(_String(),), forced=_String(), text=text)
    ended, goes_on = sources.matches(2, length=3, count=2)
    assert ended.tokens == (11, 12) and ended.support == (ENDS_NOW, FORCED)
    assert goes_on.tokens[:2] == (3, 4) and goes_on.support[0] == GOES_ON
