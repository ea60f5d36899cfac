"""Constrained decoding (engine/decoding/grammar.py): every reply follows its grammar, lookahead's text is plain
decoding's, and the text a grammar forces is drafted."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import numpy as np
import pytest

from engine import GenerationControls, Message, SamplingConfig, StopConfig
from engine.decoding.grammar import Constraint, GrammarError, GrammarState, follows
from engine.decoding.origins import DraftOrigin
from engine.decoding.settings import DEFAULT_LOOKAHEAD, LookaheadConfig

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["engineer", "teacher", "doctor"]},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "skills"],
    "additionalProperties": False,
}
ASK = "Extract the person: Ana Ruiz, 41, teaches chemistry and plays the cello."
SAMPLERS = {
    "greedy": SamplingConfig(),
    "dry": SamplingConfig(dry_multiplier=0.8),
    "sampled": SamplingConfig(temperature=0.8, seed=5),
}


def _reply(engine, constraint, lookahead, sampling=SamplingConfig(), ask=ASK, max_tokens=96):
    engine.reset()
    prompt = engine.render_chat([Message("user", ask)])
    events = list(engine.generate(prompt, GenerationControls(lookahead=lookahead), sampling=sampling,
                                  stop=StopConfig(max_tokens=max_tokens), constraint=constraint))
    return events


def _text(events):
    return "".join(ev.text for ev in events)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_a_schema_reply_validates_and_lookahead_gives_plain_decodings_text(engine, sampler):
    constraint = Constraint.json_schema(PERSON)
    plain = _reply(engine, constraint, None, SAMPLERS[sampler])
    jsonschema.validate(json.loads(_text(plain)), PERSON)
    for lookahead in (DEFAULT_LOOKAHEAD, LookaheadConfig(window=2, ngram=3, guesses=2)):
        events = _reply(engine, constraint, lookahead, SAMPLERS[sampler])
        assert [t for ev in events for t in ev.token_ids] == [t for ev in plain for t in ev.token_ids]


def test_the_text_a_schema_forces_is_drafted_and_lands(engine):
    events = _reply(engine, Constraint.json_schema(PERSON), DEFAULT_LOOKAHEAD)
    sources = [s for ev in events for s in ev.token_sources]
    # the keys, quotes and punctuation: a good part of the reply, and fewer forward passes than tokens
    assert sources.count(DraftOrigin.GRAMMAR) >= len(sources) // 4
    assert len(events) < len(sources)
    assert events[-1].stop_reason == "eog"  # the object closed and the reply ended there


def test_any_json_object_and_a_gbnf_grammar(engine):
    ask = "Give me a JSON object with a cat's name and age."
    events = _reply(engine, Constraint("json"), DEFAULT_LOOKAHEAD, ask=ask)
    assert isinstance(json.loads(_text(events)), dict)
    yes_no = Constraint("gbnf", 'root ::= ("yes" | "no") "."')
    answer = _text(_reply(engine, yes_no, DEFAULT_LOOKAHEAD, ask="Is the sky blue? Answer yes or no."))
    assert answer in ("yes.", "no.")


def test_a_grammar_that_cannot_be_used_is_refused_with_a_reason_and_the_engine_goes_on(engine):
    with pytest.raises(GrammarError, match="grammar"):
        _reply(engine, Constraint("gbnf", "root ::= ( unclosed"), None)
    with pytest.raises(GrammarError):
        _reply(engine, Constraint("json_schema", "{not json"), None)
    with pytest.raises(GrammarError):
        _reply(engine, Constraint("json_schema", json.dumps({"type": "object", "$ref": "#/nowhere"})), None)
    assert _text(_reply(engine, None, None, max_tokens=4))


def test_the_state_cuts_drafts_at_the_first_forbidden_token_and_forces_only_what_is_forced(engine):
    model = engine.model
    state = GrammarState(model, Constraint("gbnf", 'root ::= "The answer is " [0-9]+ "."'))
    forced = state.forced(20)
    assert engine.detokenize(list(forced)) == "The answer is "  # then a digit: a choice
    # forced text is given in its own split: the one token allowed first, no other split of the same bytes
    assert state.given() == forced[0] and state.allows(forced[0])
    assert not state.allows(model.tokenize("T", parse_special=False)[0])
    good, bad = model.tokenize("The answer is 42."), model.tokenize("The answer was 42.")
    assert state.keep(tuple(good)) == len(good)
    assert 0 < state.keep(tuple(bad)) < len(bad)
    for tok in good:
        assert state.allows(tok)
        state.commit(tok)
    assert state.complete
    assert state.forced(5) == ()


def test_a_masked_row_keeps_the_logits_of_exactly_the_tokens_the_grammar_allows(engine):
    model = engine.model
    state = GrammarState(model, Constraint("gbnf", 'root ::= "The answer is " [0-9]+ "."'))
    for tok in state.forced(20):
        state.commit(tok)
    row = np.arange(model.n_vocab, dtype=np.float32)
    state.mask(row)
    kept = np.flatnonzero(np.isfinite(row))
    assert 0 < len(kept) < 200 and all(row[t] == t for t in kept)  # a few digit tokens, logits unchanged
    assert all(state.allows(int(t)) for t in kept)
    digits = [model.tokenize(d, parse_special=False)[0] for d in "0123456789"]
    assert set(digits) <= set(kept.tolist())
    assert not any(state.allows(int(t)) for t in np.flatnonzero(~np.isfinite(row))[:: max(model.n_vocab // 500, 1)])


def test_text_forced_past_the_given_tokens_is_offered_as_a_guess_in_its_own_split(engine):
    model = engine.model
    contact = {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
               "required": ["name", "email"], "additionalProperties": False}
    state = GrammarState(model, Constraint.json_schema(contact))
    # '{"name": "' is forced, but llguidance gives its tokens only up to where the model might merge the rest
    # with the value's first letters
    given = state.forced(20)
    guess = state.likely(20)
    assert guess and engine.detokenize([*given, *guess]) == '{"name": "'
    assert state.likely(len(guess) - 1) == guess[:-1]
    for tok in given:
        state.commit(tok)
    assert state.forced(20) == () and state.likely(20) == guess  # the same guess, now from here
    for tok in model.tokenize(' "Dr. Lena', parse_special=False):
        state.commit(tok)
    assert state.likely(20) == ()  # inside the value, nothing is forced


def test_a_copied_value_ends_its_string_where_its_clause_ends_and_the_next_key_comes_with_it(engine):
    model = engine.model
    contact = {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
               "required": ["name", "email"], "additionalProperties": False}
    state = GrammarState(model, Constraint.json_schema(contact))
    for tok in model.tokenize('{"name": "Dr. Lena', parse_special=False):
        state.commit(tok)

    def ending(text):
        tokens = tuple(model.tokenize(text, parse_special=False))
        found = state.ending(tokens)
        return None if found is None else engine.detokenize([*tokens[: found[0]], *found[1]])

    assert ending(" Fischer, lena.fischer@example.org") == ' Fischer", "email":'
    assert ending(" Fischer") is None  # no clause ends in it
    assert ending(" Fischer.de") is None  # a dot inside a word ends nothing
    assert state.keep(tuple(model.tokenize(" Fischer", parse_special=False))) > 0  # the state is as it was


STORY = {
    "type": "object",
    "properties": {
        "story": {"type": "string"},
        "mood": {"enum": ["happy", "sad"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "pages": {"type": "integer"},
    },
    "required": ["story", "mood", "tags", "pages"],
    "additionalProperties": False,
}


def _running_past(engine, constraint, ask, limit, sampler):
    """``sampler``, or where it draws, the first of a few seeds with which the reply runs past ``limit`` (which
    ones do depends on the CPU's arithmetic)."""
    sampling = SAMPLERS[sampler]
    for seed in range(sampling.seed, sampling.seed + (8 if sampling.temperature > 0 else 1)):
        tried = replace(sampling, seed=seed)
        if sum(len(ev.token_ids) for ev in _reply(engine, constraint, None, tried, ask, 2 * limit)) > limit + 8:
            return tried
    pytest.fail(f"no reply ran past {limit} tokens")


@pytest.mark.parametrize("sampler", ["greedy", "sampled"])
def test_a_reply_that_would_run_past_its_limit_is_closed_in_time_to_parse_in_every_mode(engine, sampler):
    ask, limit = "Write a long story about a cat who sails around the world, as JSON.", 48
    constraint = Constraint.json_schema(STORY)
    sampling = _running_past(engine, constraint, ask, limit, sampler)
    plain = _reply(engine, constraint, None, sampling, ask=ask, max_tokens=limit)
    tokens = [t for ev in plain for t in ev.token_ids]
    reply = json.loads(_text(plain))
    jsonschema.validate(reply, STORY)
    assert len(tokens) <= limit and len(reply["story"]) > 20  # the story was cut short, not left out
    assert plain[-1].stop_reason == "max_tokens"  # cut by its limit all the same
    events = _reply(engine, constraint, DEFAULT_LOOKAHEAD, sampling, ask=ask, max_tokens=limit)
    assert [t for ev in events for t in ev.token_ids] == tokens


def test_a_reply_stopped_short_of_its_grammars_end_is_closed_from_its_last_kept_token(engine):
    model, constraint = engine.model, Constraint.json_schema(PERSON)
    start = model.tokenize('{"name": "Ana", "age": 41, "role": "teacher", "skills": ["cello", "chess',
                           parse_special=False)
    past = model.tokenize('", "chess', parse_special=False)  # committed in the same step, past the reply's end
    state = GrammarState(model, constraint, max_tokens=96)
    for tok in [*start, *past]:
        state.commit(tok)
    whole = GrammarState(model, constraint, max_tokens=96)
    for tok in model.tokenize('{"name": "Ana", "age": 41, "role": "teacher", "skills": []}', parse_special=False):
        whole.commit(tok)
    assert whole.close_now(0, 96) == []  # whole already: nothing to close, not even the end-of-text token
    way = state.close_now(len(past), limit=8)
    assert 0 < len(way) <= 8 and not any(model.is_eog(t) for t in way) and state.complete
    reply = json.loads(engine.detokenize([*start, *way]))
    jsonschema.validate(reply, PERSON)
    assert reply["skills"][-1].startswith("chess")  # the string the reply stood in, ended, not dropped
    short = GrammarState(model, constraint, max_tokens=96)
    for tok in start:
        short.commit(tok)
    assert short.close_now(0, limit=1) == []  # no way within the tokens left: the reply ends as it stands


LIST_ASK = "List the planets."  # the bundled model answers it, under PLANETS, naming one planet over and over
PLANETS = {"type": "object", "properties": {"planets": {"type": "array", "items": {"type": "string"}}},
           "required": ["planets"]}


@pytest.mark.auto
@pytest.mark.parametrize("lookahead", [None, DEFAULT_LOOKAHEAD], ids=["plain", "auto"])
def test_a_reply_the_loop_guard_stops_under_a_schema_is_closed_there_and_still_parses(engine, lookahead):
    constraint = Constraint.json_schema(PLANETS)

    def reply(loop_guard):
        engine.reset()
        prompt = engine.render_chat([Message("user", LIST_ASK)])
        stop = StopConfig(max_tokens=160, loop_guard=loop_guard)
        return list(engine.generate(prompt, GenerationControls(lookahead=lookahead), stop=stop,
                                    constraint=constraint))

    guarded, unguarded = reply(True), reply(False)
    assert guarded[-1].stop_reason == "loop"
    tokens = [t for ev in guarded for t in ev.token_ids]
    jsonschema.validate(json.loads(_text(guarded)), PLANETS)
    assert follows(engine.model, constraint, tokens)
    ran_on = [t for ev in unguarded for t in ev.token_ids]
    kept = next(i for i, (a, b) in enumerate(zip(tokens, ran_on, strict=False)) if a != b)
    assert 0 < len(tokens) - kept <= 4 < len(ran_on) - kept  # the guard's stop, then a short closing


def test_a_reply_follows_its_schema_only_when_it_is_whole_json_of_it(engine):
    model, constraint = engine.model, Constraint.json_schema(PERSON)

    def tokens(text):
        return model.tokenize(text, parse_special=False)

    whole = '{"name": "Ana", "age": 41, "role": "teacher", "skills": ["cello"]}'
    assert follows(model, constraint, [*tokens(whole), model.eos()])
    assert not follows(model, constraint, tokens(whole[:-1]))  # cut short
    assert not follows(model, constraint, tokens(whole.replace("teacher", "pilot")))  # not one of the enum


@pytest.mark.parametrize("sampler", ["dry", "sampled"])
def test_a_position_the_grammar_gives_is_decoded_without_logits_and_the_text_stays_plain_decodings(
        engine, sampler, monkeypatch):
    from engine.decoding import decoders

    plans = []

    def recorded(*args, **kwargs):
        plans.append(decoders_build_step(*args, **kwargs))
        return plans[-1]

    decoders_build_step = decoders.build_step
    monkeypatch.setattr(decoders, "build_step", recorded)
    constraint = Constraint.json_schema(PERSON)
    plain = _reply(engine, constraint, None, SAMPLERS[sampler])
    events = _reply(engine, constraint, DEFAULT_LOOKAHEAD, SAMPLERS[sampler])
    assert [t for ev in events for t in ev.token_ids] == [t for ev in plain for t in ev.token_ids]
    # the opening '{"name": ' and every later key were decoded with logits on fewer rows than the batch had
    assert sum(plan.n_logits < plan.size for plan in plans) >= 3
    # plain decoding puts a given token into the cache without asking for the next position's logits, and its
    # text is the one with logits everywhere
    given = [ev for ev in plain if ev.n_logits == 0]
    assert len(given) >= 5 and all(ev.batch_size == 1 and len(ev.token_ids) == 1 for ev in given)
    monkeypatch.setattr(decoders.TokenDrawer, "given", lambda self, limit: ())
    with_logits = _reply(engine, constraint, None, SAMPLERS[sampler])
    assert all(ev.n_logits == 1 for ev in with_logits)
    assert [t for ev in with_logits for t in ev.token_ids] == [t for ev in plain for t in ev.token_ids]


def test_the_drawer_takes_a_given_token_without_logits_and_refuses_to_guess_an_open_one(engine):
    from engine.decoding.decoders import TokenDrawer

    model = engine.model
    state = GrammarState(model, Constraint("gbnf", 'root ::= "The answer is " [0-9]+ "."'))
    drawer = TokenDrawer(engine.loaded.ctx, None, state)  # no logits passed: a given token needs none
    forced = state.forced(20)
    assert [drawer.draw(0, None) for _ in forced] == list(forced)
    with pytest.raises(RuntimeError, match="without logits"):
        drawer.draw(0, None)  # a digit: the model's choice
