"""The loop guard (engine/decoding/loops.py): a tail that repeats one span stops the reply, copying does not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from engine import LookaheadConfig
from engine.decoding.loops import LONG_SPAN, MAX_PERIOD, MIN_LOOP_TOKENS, MIN_REPEATS, LoopGuard
from engine.decoding.settings import DEFAULT_LOOKAHEAD


def _stop_index(context: Sequence[int], reply: Sequence[int], **thresholds: Any) -> int | None:
    guard = LoopGuard(context, **thresholds)
    return next((i for i, token in enumerate(reply) if guard.push(token)), None)


def test_a_two_token_span_over_and_over_stops_once_it_fills_the_minimum_length():
    reply = [7, 8, 9] + [1, 2] * 40  # "… not only not only not only …"
    stop = _stop_index([100, 101], reply)
    assert stop == 3 + MIN_LOOP_TOKENS - 1  # the tail [1, 2] * 12 is the first that is long enough


def test_a_short_span_must_follow_itself_min_repeats_times_and_a_sentence_one_time_less():
    phrase = list(range(10, 20))  # 10 tokens: "the leaves are a fleeting sight,"
    assert _stop_index([], [5] + phrase * 6) == MIN_REPEATS * len(phrase)  # the fourth copy's last token
    sentence = list(range(30, 30 + LONG_SPAN + 4))
    assert _stop_index([], [5] + sentence * 6) == (MIN_REPEATS - 1) * len(sentence)


def test_a_word_said_three_times_or_a_short_run_is_not_a_loop():
    assert _stop_index([], [1, 2, 3, 4, 4, 4, 5, 6, 7, 8] * 3) is None
    assert _stop_index([], [9] * (MIN_LOOP_TOKENS - 1)) is None
    assert _stop_index([], [9] * MIN_LOOP_TOKENS) == MIN_LOOP_TOKENS - 1


def test_repeating_what_the_prompt_holds_is_copying_not_a_loop():
    row = [40, 41, 42, 43, 44, 45, 46, 47]  # a table row the prompt lists six times
    prompt = [1, 2, 3] + row * 6 + [4, 5]
    assert _stop_index(prompt, row * 6) is None
    # going on past what the prompt holds is a loop again: at the end of a seventh row, one more than it shows
    assert _stop_index(prompt, row * 12) == len(row) * 7 - 1


def test_rows_the_prompt_repeats_may_come_back_changed_as_often_but_not_forever():
    row = [40, 41, 42, 43, 44, 45, 46, 47]  # "| bolt | 10 |"
    prompt = [1, 2] + row * 4 + [3]
    edited = row[:-1] + [90, 91, 47]  # the same row with a column added
    assert _stop_index(prompt, [5] + edited * 4 + [6]) is None
    assert _stop_index(prompt, [5] + edited * 9) == 1 + len(edited) * 5 - 1


def test_rows_that_differ_only_in_the_spaces_padding_them_are_one_row_over_and_over():
    pieces = {1: b"|", 2: b"   ", 3: b"    ", 4: b"      ", 5: b"\n", 7: b"\n\n", 8: b"\t "}
    rows = [[1, pad, 1, pad, 1, 5] for pad in (2, 3, 4, 8, 3, 2, 4, 3)]  # "|   |   |\n", "|    |    |\n", ...
    reply = [tok for row in rows for tok in row]
    assert _stop_index([], reply) is None  # token by token, no two rows are the same
    assert _stop_index([], reply, piece=pieces.__getitem__) == MIN_LOOP_TOKENS - 1
    # a newline is not padding: rows ended by one or by two newlines differ
    ends = [5, 7, 7, 5, 7, 5, 5, 7]
    other = [tok for row, end in zip(rows, ends, strict=True) for tok in [*row[:-1], end]]
    assert _stop_index([], other, piece=pieces.__getitem__) is None


def test_spans_longer_than_the_longest_period_looked_for_are_not_stopped():
    span = list(range(100, 100 + MAX_PERIOD + 6))
    assert _stop_index([], span * 5) is None
    assert _stop_index([], span * 5, max_period=MAX_PERIOD + 16) == len(span) * (MIN_REPEATS - 1) - 1


# --- on the bundled model -----------------------------------------------------------------------------------------

# The bundled model answers this with a table's empty rows, over and over, at the app's defaults (greedy).
LOOPING_PROMPT = "Make a Markdown table of four planets with their diameter and number of moons."


def _reply(engine, lookahead, loop_guard: bool):
    from engine import GenerationControls, RunStats, StopConfig
    from engine.decoding.session import ChatSession
    from engine.decoding.text import conversation_messages

    engine.reset()
    messages = conversation_messages("You are a helpful assistant.", user_text=LOOPING_PROMPT)
    stats, text = RunStats(), []
    for ev in ChatSession(engine).reply(messages, controls=GenerationControls(lookahead=lookahead),
                                        stop=StopConfig(max_tokens=160, loop_guard=loop_guard)):
        stats.observe(ev)
        text.append(ev.text)
    return stats, "".join(text)


@pytest.mark.model
@pytest.mark.auto
@pytest.mark.parametrize("lookahead", [DEFAULT_LOOKAHEAD, LookaheadConfig(window=4, ngram=4, guesses=3)],
                         ids=["auto", "W4-N4-G3"])
def test_plain_decoding_and_lookahead_stop_a_looping_reply_at_the_same_token(engine, lookahead):
    plain, plain_text = _reply(engine, None, loop_guard=True)
    ahead, ahead_text = _reply(engine, lookahead, loop_guard=True)
    unguarded, unguarded_text = _reply(engine, None, loop_guard=False)
    assert plain.stop_reason == ahead.stop_reason == "loop"
    assert plain_text == ahead_text and plain.n_tokens == ahead.n_tokens < unguarded.n_tokens
    assert unguarded.stop_reason == "max_tokens" and unguarded_text.startswith(plain_text)
