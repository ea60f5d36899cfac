"""Tools and structured output through the ``openai`` client, as an agent or an extraction script would use them.

Tools need a template that takes them: the bundled model with a Hermes template (tests/helpers/tool_model.py).
Every call's arguments parse and match the tool's parameters (a grammar holds them to it); lookahead on and
off give the same text; the markup the grammar forces is drafted.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from engine import Engine
from tests.helpers.serving import serving
from tests.helpers.tool_model import write_with_template

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}]
INVOICE = {
    "type": "object",
    "properties": {"number": {"type": "string"}, "total": {"type": "number"},
                   "currency": {"enum": ["EUR", "USD", "GBP"]},
                   "items": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
    "required": ["number", "total", "currency", "items"],
    "additionalProperties": False,
}
EXTRACT = [{"role": "user", "content": "Invoice INV-204 from Acme: two chairs and a desk, total 310.50 EUR. "
                                       "Give the invoice's fields as JSON."}]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory, model_path):
    engine = Engine(str(write_with_template(model_path, tmp_path_factory.mktemp("tools") / "hermes.gguf")),
                    n_ctx=2048, n_threads=2)
    try:
        with serving(engine, "m") as server:
            yield server
    finally:
        engine.close()


@pytest.fixture(scope="module")
def tool_client(tool_server):
    with openai.OpenAI(base_url=tool_server.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def client(engine):
    with serving(engine, "bundled") as server, \
            openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _streamed_call(client, **kwargs):
    """The tool calls and text of a streamed reply, put together from its chunks, and its finish reason."""
    calls, text, finish = {}, [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        text.append(choice.delta.content or "")
        for delta in choice.delta.tool_calls or []:
            calls[delta.index] = delta
        finish = choice.finish_reason or finish
    return [calls[k] for k in sorted(calls)], "".join(text), finish


def test_a_tool_call_round_trip_whole_and_streamed(tool_client):
    asked = dict(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=96)
    whole = tool_client.chat.completions.create(**asked)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls and message.content is None
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    calls, text, finish = _streamed_call(tool_client, **asked)
    assert text == "" and finish == "tool_calls"  # no markup went out as text
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in message.tool_calls]

    answer = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 7, "sky": "cloudy"})}]
    final = tool_client.chat.completions.create(model="m", messages=answer, tools=[WEATHER], tool_choice="none",
                                                max_tokens=48)
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content
    assert "<tool_call>" not in final.choices[0].message.content


def test_a_tool_round_trip_through_anthropics_messages_api(tool_server):
    anthropic = pytest.importorskip("anthropic")
    tool = {"name": "get_weather", "description": "The weather now in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    base = tool_server.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120) as client:
        asked = dict(model="m", max_tokens=96, messages=ASK, tools=[tool], tool_choice={"type": "any"})
        message = client.messages.create(**asked)
        assert message.stop_reason == "tool_use"
        use = next(b for b in message.content if b.type == "tool_use")
        assert use.name == "get_weather"
        jsonschema.validate(use.input, tool["input_schema"])
        with client.messages.stream(**asked) as stream:
            streamed = stream.get_final_message()
        assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == \
            [(b.name, b.input) for b in message.content if b.type == "tool_use"]
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "7 degrees and cloudy"}
        final = client.messages.create(model="m", max_tokens=48, tools=[tool], tool_choice={"type": "none"},
                                       messages=[*ASK, {"role": "assistant", "content": message.content},
                                                 {"role": "user", "content": [result]}])
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.content and final.content[0].type == "text" and final.content[0].text


def test_a_named_function_is_the_one_called_and_lookahead_changes_nothing(tool_client):
    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
    replies = []
    for lookahead in ("off", "auto"):
        r = tool_client.chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, other], max_tokens=96, parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "get_time"}}, extra_body={"lookahead": lookahead})
        replies.append(r)
    off, auto = replies
    assert [c.function.name for c in off.choices[0].message.tool_calls] == ["get_time"]
    assert [c.function.arguments for c in off.choices[0].message.tool_calls] == \
        [c.function.arguments for c in auto.choices[0].message.tool_calls]
    timings = auto.model_extra["timings"]
    assert timings["forward_passes"] < timings["predicted_n"]  # the forced markup landed as drafts


def test_tools_on_a_model_whose_template_takes_none_are_refused_with_the_reason(client):
    with pytest.raises(openai.BadRequestError, match="does not take tools"):
        client.chat.completions.create(model="bundled", messages=ASK, tools=[WEATHER], max_tokens=8)
    ok = client.chat.completions.create(model="bundled", messages=ASK, max_tokens=4)
    assert ok.choices[0].message.content


@pytest.mark.parametrize("lookahead", ["off", "auto"])
def test_a_json_schema_reply_validates_and_is_the_same_with_lookahead(client, lookahead):
    fmt = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": INVOICE, "strict": True}}
    r = client.chat.completions.create(model="bundled", messages=EXTRACT, response_format=fmt, max_tokens=128,
                                       extra_body={"lookahead": lookahead})
    jsonschema.validate(json.loads(r.choices[0].message.content), INVOICE)
    first = client.chat.completions.create(model="bundled", messages=EXTRACT, response_format=fmt, max_tokens=128,
                                           extra_body={"lookahead": "off"})
    assert r.choices[0].message.content == first.choices[0].message.content


def test_json_object_and_a_gbnf_grammar(client):
    cat = [{"role": "user", "content": "Give me a JSON object with a cat's name and age."}]
    r = client.chat.completions.create(model="bundled", messages=cat, max_tokens=128,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    question = [{"role": "user", "content": "Is water wet? Answer yes or no."}]
    r = client.chat.completions.create(model="bundled", max_tokens=8, messages=question,
                                       extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].message.content in ("yes", "no")


@pytest.mark.parametrize(("extra", "names"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"extra_body": {"grammar": "root ::= ( unclosed"}}, "grammar"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "elsewhere"}}}, "elsewhere"),
])
def test_bad_structured_requests_get_a_400_that_names_the_field(client, extra, names):
    with pytest.raises(openai.BadRequestError, match=names):
        client.chat.completions.create(model="bundled", messages=ASK, max_tokens=8, **extra)
