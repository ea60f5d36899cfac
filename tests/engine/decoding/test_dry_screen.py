"""DryScreen (engine/decoding/dry.py): it predicts DRY's penalty as llama.cpp gives it, and drafts stop there."""

from __future__ import annotations

import ctypes
import random

import llama_cpp as ll
import pytest

from engine.decoding.drafts import DraftSources, HistoryIndex
from engine.decoding.dry import DryScreen
from engine.decoding.origins import DraftOrigin
from engine.decoding.pool import NgramPool
from engine.llama.native import DRY_BREAKERS, DRY_WINDOW

BREAK = 0  # the one breaker of the pure tests: a line end


def _screen(seen, threshold=5.0, multiplier=0.8, base=1.75, allowed=2):
    screen = DryScreen(lambda t: t == BREAK, multiplier, base, allowed, threshold)
    screen.extend(seen)
    return screen


def test_a_token_that_extends_a_repeat_is_penalised_by_its_length():
    screen = _screen([1, 2, 3, 4, 9, 1, 2, 3])
    # "1 2 3" came before "4": a third token of repeat is penalised 0.8 * 1.75
    assert list(screen.penalties([4])) == [pytest.approx(0.8 * 1.75)]
    # then "1 2 3 4" before "9": one more token of repeat, one more factor
    assert list(screen.penalties([4, 9])) == [pytest.approx(1.4), pytest.approx(0.8 * 1.75**2)]
    assert list(screen.penalties([7])) == [0.0]  # nothing followed "1 2 3" with 7


def test_a_repeat_shorter_than_the_allowed_length_is_free():
    assert list(_screen([5, 1, 2, 6, 1]).penalties([2])) == [0.0]  # one token ("1") of repeat before it
    assert list(_screen([5, 1, 2, 6, 5, 1]).penalties([2])) == [pytest.approx(0.8)]  # two: the allowed length


def test_a_repeat_is_not_followed_across_a_breaker_and_a_breaker_is_never_penalised():
    line = [1, 2, 3, 4]
    screen = _screen(line + [BREAK] + line[:3])
    assert list(screen.penalties([4])) == [pytest.approx(0.8 * 1.75)]
    screen = _screen([1, 2, BREAK, 3, 4, 5, 1, 2, BREAK, 3, 4])
    # "3 4" (after the breaker) is the whole repeat that 5 would extend, however long the match before it
    assert list(screen.penalties([5])) == [pytest.approx(0.8)]
    assert list(_screen([7, 8, BREAK, 7, 8]).penalties([BREAK])) == [0.0]


def test_a_draft_that_repeats_itself_is_seen_within_the_draft():
    screen = _screen([50, 51])
    # the draft writes 1 2 3 4 and then 1 2 3 again: its second 3 and 4 repeat its own text
    penalties = list(screen.penalties([1, 2, 3, 4, 1, 2, 3, 4]))
    assert penalties[:6] == [0.0] * 6
    assert penalties[6:] == [pytest.approx(0.8), pytest.approx(0.8 * 1.75)]  # its 3 and 4 repeat 2 and 3 tokens


def test_keep_stops_before_the_first_token_penalised_past_the_threshold():
    phrase = list(range(10, 20))
    screen = _screen(phrase + [99] + phrase[:2], threshold=3.0)
    # 12 extends a 2-token repeat (0.8), 13 a 3-token one (1.4), 14 2.45, 15 4.29: the draft stops before 15
    assert screen.keep(phrase[2:]) == 3
    assert screen.keep([77, 78]) == 2


def test_drafts_are_cut_where_dry_turns_them_down_and_dropped_when_nothing_is_left():
    phrase = list(range(10, 30))
    history = HistoryIndex()
    history.extend([99] + phrase + [98] + phrase[:2])
    screen = _screen(phrase + [98] + phrase[:2])
    sources = DraftSources(history, NgramPool(max_len=4), screens=(screen,))
    (draft,) = sources.matches(phrase[1], 10, 1)
    # phrase[2..5] extend repeats of 2..5 tokens (0.8 to 4.3 logits); phrase[6] would lose 0.8 * 1.75**4 = 7.5
    assert draft.tokens == tuple(phrase[2:6])
    unscreened = DraftSources(history, NgramPool(max_len=4))
    assert unscreened.matches(phrase[1], 10, 1)[0].tokens == tuple(phrase[2:12])
    screen.extend(phrase[2:6])
    history.extend(phrase[2:6])
    assert sources.matches(phrase[5], 10, 1) == []
    pool = NgramPool(max_len=4)
    pool.add(phrase[5], tuple(phrase[6:10]), DraftOrigin.REPLY)
    assert DraftSources(history, pool).ngrams(phrase[5], 1, 4)[0].tokens == tuple(phrase[6:10])
    assert DraftSources(history, pool, screens=(screen,)).ngrams(phrase[5], 1, 4) == []


# --- against llama.cpp's own DRY sampler ---


def _llama_dry_penalties(model, seen, candidates, multiplier, base, allowed):
    """What llama.cpp's DRY subtracts from each candidate's logit after it has accepted ``seen``."""
    breakers = (ctypes.c_char_p * len(DRY_BREAKERS))(*(b.encode() for b in DRY_BREAKERS))
    dry = ll.llama_sampler_init_dry(model.vocab, multiplier, base, allowed, DRY_WINDOW, breakers, len(DRY_BREAKERS))
    try:
        for tok in seen:
            ll.llama_sampler_accept(dry, tok)
        data = (ll.llama_token_data * len(candidates))(*(ll.llama_token_data(t, 0.0, 0.0) for t in candidates))
        arr = ll.llama_token_data_array(data=data, size=len(candidates), selected=-1, sorted=False)
        ll.llama_sampler_apply(dry, ctypes.byref(arr))
        return [-data[k].logit for k in range(len(candidates))]
    finally:
        ll.llama_sampler_free(dry)


@pytest.mark.parametrize("seed", range(6))
def test_the_screen_predicts_llama_cpp_dry_penalty_for_every_candidate(engine, seed):
    model = engine.model
    rng = random.Random(seed)
    words = [model.tokenize(w)[0] for w in (" cat", " sat", " on", " the", " mat", ":", "\n", '"', " a")]
    multiplier, base, allowed = rng.choice([(0.8, 1.75, 2), (1.2, 1.5, 3), (0.5, 2.0, 1)])
    for _ in range(20):
        phrase = [rng.choice(words) for _ in range(rng.randint(3, 9))]
        seen: list[int] = []
        while len(seen) < 60:  # repeats of the phrase, sometimes changed, with other words between
            seen += [rng.choice(words) if rng.random() < 0.15 else t for t in phrase] + [rng.choice(words)]
        seen = seen[: rng.randint(3, 80)]
        expected = _llama_dry_penalties(model, seen, words, multiplier, base, allowed)
        screen = DryScreen(model.is_dry_breaker, multiplier, base, allowed, threshold=1e9)
        screen.extend(seen)
        predicted = [screen.penalties([w])[0] for w in words]
        assert predicted == pytest.approx(expected, rel=1e-5, abs=1e-6), (seen, words)

