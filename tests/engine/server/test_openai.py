"""The local server through the official ``openai`` client: plain decoding's text whatever lookahead does.

A request with ``lookahead`` off, auto or a fixed shape gives the text ``engine generate`` gives with plain
decoding, streamed or not, greedy or sampled with a seed; every response says what lookahead did (``timings``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine import GenerationControls, RunStats, SamplingConfig, StopConfig
from engine.decoding.text import Message
from tests.helpers.serving import serving

openai = pytest.importorskip("openai")  # a test dependency ([test] extra): missing, this fails in CI's install

pytestmark = pytest.mark.model

MODEL_ID = "bundled"
LOOKAHEADS = {"off": "off", "auto": "auto", "fixed": {"window": 4, "ngram": 4, "guesses": 3}}
QUESTION = "List the days of the week, one per line."
# Repeats its own text: drafts land, so the fixed and Auto runs verify drafts, not just decode
REPEATING = "Repeat this line three times exactly: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def server(engine):
    with serving(engine, MODEL_ID) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def plain_text(engine, messages: list[Message] | None = None, prompt: str | None = None, max_tokens: int = 64,
               sampling: SamplingConfig = SamplingConfig()) -> str:
    tokens = engine.render_chat(messages) if messages is not None else engine.tokenize(prompt)
    events = engine.generate(tokens, controls=GenerationControls(lookahead=None), sampling=sampling,
                             stop=StopConfig(max_tokens=max_tokens))
    return RunStats.of(events).text


def chat(client, content: str, lookahead, stream: bool, max_tokens: int = 64, **extra):
    """The reply's text and its timings, streamed or not."""
    kwargs = dict(model=MODEL_ID, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
                  extra_body={"lookahead": lookahead}, **extra)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        assert r.usage.completion_tokens > 0
        return r.choices[0].message.content, r.model_extra["timings"]
    parts, timings, usage = [], None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
            timings = chunk.model_extra["timings"]
    assert usage is not None and usage.completion_tokens > 0, "the last chunk carries the usage"
    return "".join(parts), timings


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", list(LOOKAHEADS))
def test_greedy_chat_is_plain_decodings_text(engine, client, mode, stream):
    text, timings = chat(client, QUESTION, LOOKAHEADS[mode], stream)
    assert text == plain_text(engine, [Message("user", QUESTION)])
    assert timings["lookahead"] == mode
    assert timings["predicted_n"] > 0 and timings["forward_passes"] > 0


def test_greedy_chat_equals_engine_generate_plain(client, model_path):
    """The reference is the command line's own plain decoding, in another process."""
    out = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--model", str(model_path), "--chat", "--prompt", QUESTION,
         "--mode", "plain", "--max-tokens", "48", "--threads", "2", "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    reference = json.loads(out.stdout)["text"]
    for mode in LOOKAHEADS:
        text, _ = chat(client, QUESTION, LOOKAHEADS[mode], stream=False, max_tokens=48)
        assert text == reference, mode


def test_seeded_sampled_chat_is_the_same_text_in_every_mode(engine, client):
    poem = "Write a short poem about rain."
    texts = {mode: chat(client, poem, LOOKAHEADS[mode], stream=mode == "auto", max_tokens=48,
                        temperature=0.8, seed=7, top_p=0.9)[0]
             for mode in LOOKAHEADS}
    # top_k and min_p are the engine's defaults on both sides
    reference = plain_text(engine, [Message("user", poem)], max_tokens=48,
                           sampling=SamplingConfig(temperature=0.8, seed=7, top_p=0.9))
    assert set(texts.values()) == {reference}, texts
    greedy = plain_text(engine, [Message("user", poem)], max_tokens=48)
    assert reference != greedy, "the request sampled: a greedy reply would make this test say nothing"


def test_drafts_land_on_a_reply_that_repeats_text(client):
    text, timings = chat(client, REPEATING, LOOKAHEADS["fixed"], stream=False, max_tokens=96)
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0, timings
    assert timings["forward_passes"] < timings["predicted_n"], "some step gave more than one token"
    assert timings["tokens_per_step"] > 1.0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", list(LOOKAHEADS))
def test_completions_are_plain_decodings_text(engine, client, mode, stream):
    prompt = "Monday, Tuesday, Wednesday,"
    kwargs = dict(model=MODEL_ID, prompt=prompt, max_tokens=40, extra_body={"lookahead": LOOKAHEADS[mode]})
    if stream:
        text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices)
    else:
        r = client.completions.create(**kwargs)
        text = r.choices[0].text
        assert r.model_extra["timings"]["lookahead"] == mode
        assert r.choices[0].finish_reason in ("stop", "length")
    assert text == plain_text(engine, prompt=prompt, max_tokens=40)


def test_stop_strings_end_the_text_before_them(engine, client):
    full = plain_text(engine, [Message("user", QUESTION)])
    stop = "Wednesday"
    assert stop in full, "the reference reply names the day the stop string is made of"
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=64, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.index(stop)]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL_ID]


def test_unsupported_field_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], n=2)
    assert info.value.body["param"] == "n"


def test_seeded_sampled_completion_is_the_same_text_in_every_mode(engine, client):
    prompt = "Once upon a time, in a village by the sea,"
    texts = {mode: client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=40, temperature=0.9, seed=11,
                                             extra_body={"lookahead": LOOKAHEADS[mode]}).choices[0].text
             for mode in LOOKAHEADS}
    reference = plain_text(engine, prompt=prompt, max_tokens=40, sampling=SamplingConfig(temperature=0.9, seed=11))
    assert set(texts.values()) == {reference}, texts
    assert reference != plain_text(engine, prompt=prompt, max_tokens=40), "sampled, not greedy"
