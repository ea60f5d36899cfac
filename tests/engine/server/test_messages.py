"""Anthropic's Messages API on the local server: the same chat, jobs and checks as OpenAI's route, in Anthropic's
shapes.

First the translation alone, without a model: a Messages body becomes the chat body ``parse_chat`` reads (tool
uses and results included), the OpenAI reply becomes Anthropic's message and stream events, and every refusal
takes Anthropic's error shape. Then the real server through the official ``anthropic`` client: on the bundled
model where the reply's text matters, on a stand-in that says one word (``OneWordEngine``) where only the server's
own answer does (the key, refusals, the model's name).
"""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine.decoding.generation import StepEvent
from engine.decoding.text import Message
from engine.server import ApiError
from engine.server.api import ModelServer
from engine.server.messages import (
    ROUTE,
    MessageReply,
    anthropic_errors,
    error_body,
    sse,
    stop_of,
    to_chat_body,
    to_message,
)
from engine.server.requests import parse_chat
from engine.server.responses import Reply
from tests.helpers.fake_engine import as_engine
from tests.helpers.serving import OneWordEngine, serving

anthropic = pytest.importorskip("anthropic")  # a test dependency ([test] extra): missing, this fails in CI's install

MODEL_ID = "bundled"
API_KEY = "secret-key-123"
QUESTION = "List the days of the week, one per line."
HI = {"model": MODEL_ID, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi"}]}
WEATHER_TOOL = {"name": "weather", "description": "The weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def body(**fields: Any) -> dict[str, Any]:
    """The small normal request with ``fields`` changed (None: left out)."""
    return {k: v for k, v in {**HI, **fields}.items() if v is not None}


# -- the request ------------------------------------------------------------------------------------------------


def test_a_conversation_becomes_the_same_chat_with_the_system_prompt_first():
    chat = to_chat_body(body(system="Be brief.", messages=[
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi! "}, {"type": "text", "text": "Yes?"}]},
        {"role": "user", "content": [{"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}}]},
    ]))
    assert chat["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello"},
                                {"role": "assistant", "content": "Hi! Yes?"},
                                {"role": "user", "content": "Say hi"}]
    req = parse_chat(chat, MODEL_ID)
    assert req.messages == (Message("system", "Be brief."), Message("user", "Hello"),
                            Message("assistant", "Hi! Yes?"), Message("user", "Say hi"))


def test_a_system_prompt_of_text_blocks_is_their_text():
    chat = to_chat_body(body(system=[{"type": "text", "text": "Be brief. "},
                                     {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}]))
    assert chat["messages"][0] == {"role": "system", "content": "Be brief. Be kind."}


def test_sampling_fields_take_their_chat_names_and_metadata_is_dropped():
    chat = to_chat_body(body(stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=20, stream=True,
                             metadata={"user_id": "u1"}, lookahead="off"))
    assert {k: v for k, v in chat.items() if k != "messages"} == {
        "model": MODEL_ID, "max_tokens": 8, "stop": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 20,
        "stream": True, "lookahead": "off"}
    req = parse_chat(chat, MODEL_ID)
    assert (req.stop, req.max_tokens, req.sampling.top_k, req.lookahead, req.stream) == (("END",), 8, 20, None, True)


def test_tool_use_and_tool_result_become_tool_calls_and_tool_messages():
    chat = to_chat_body(body(messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 °C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "timeout"}],
             "is_error": True},
            {"type": "text", "text": "Which is warmer?"}]},
    ]))
    assert chat["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21 °C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "Which is warmer?"},
    ]


def test_an_assistant_turn_of_tool_use_alone_has_no_content():
    chat = to_chat_body(body(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]))
    assert chat["messages"][1]["content"] is None
    assert chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "t", "content": ""}


def test_tools_become_functions_with_their_input_schema():
    chat = to_chat_body(body(tools=[WEATHER_TOOL, {"name": "now", "input_schema": {"type": "object"}}]))
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                          "parameters": WEATHER_TOOL["input_schema"]}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, {"tool_choice": "auto"}),
    ({"type": "any"}, {"tool_choice": "required"}),
    ({"type": "none"}, {"tool_choice": "none"}),
    ({"type": "tool", "name": "weather"}, {"tool_choice": {"type": "function", "function": {"name": "weather"}}}),
    ({"type": "auto", "disable_parallel_tool_use": True}, {"tool_choice": "auto", "parallel_tool_calls": False}),
], ids=["auto", "any", "none", "tool", "one-at-a-time"])
def test_tool_choice_takes_openais_form(choice, expected):
    chat = to_chat_body(body(tools=[WEATHER_TOOL], tool_choice=choice))
    assert {k: chat[k] for k in expected} == expected


def user(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}

INVALID = [
    ("body-not-an-object", ["hello"], None),
    ("max-tokens-missing", body(max_tokens=None), "max_tokens"),
    ("messages-missing", body(messages=None), "messages"),
    ("messages-not-a-list", body(messages="Say hi"), "messages"),
    ("messages-empty", body(messages=[]), "messages"),
    ("message-not-an-object", body(messages=["Say hi"]), "messages[0]"),
    ("role-system", body(messages=[{"role": "system", "content": "Be brief."}]), "messages[0].role"),
    ("content-number", body(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    ("block-unknown-type", body(messages=user({"type": "sound", "data": "..."})), "messages[0].content[0].type"),
    ("block-image", body(messages=user(IMAGE)), "messages[0].content[0].type"),
    ("block-without-type", body(messages=user({"text": "hi"})), "messages[0].content[0].type"),
    ("text-not-a-string", body(messages=user({"type": "text", "text": 5})), "messages[0].content[0].text"),
    ("tool-use-from-the-user", body(messages=user({"type": "tool_use", "id": "t", "name": "f", "input": {}})),
     "messages[0].content[0].type"),
    ("tool-use-input-a-string", body(messages=[{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]), "messages[0].content[0].input"),
    ("tool-result-without-id", body(messages=user({"type": "tool_result", "content": "42"})),
     "messages[0].content[0].tool_use_id"),
    ("tool-result-is-error-a-string", body(messages=user({"type": "tool_result", "tool_use_id": "t",
                                                          "is_error": "yes"})),
     "messages[0].content[0].is_error"),
    ("system-a-number", body(system=5), "system"),
    ("tools-an-object", body(tools=WEATHER_TOOL), "tools"),
    ("tool-without-schema", body(tools=[{"name": "weather"}]), "tools[0].input_schema"),
    ("server-tool", body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
    ("tool-choice-a-string", body(tool_choice="auto"), "tool_choice"),
    ("tool-choice-unknown", body(tool_choice={"type": "some"}), "tool_choice.type"),
    ("tool-choice-tool-without-name", body(tool_choice={"type": "tool"}), "tool_choice.name"),
    ("unknown-field", body(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
]


@pytest.mark.parametrize(("raw", "param"), [pytest.param(raw, param, id=i) for i, raw, param in INVALID])
def test_an_invalid_request_is_refused_with_anthropics_400_naming_the_field(raw, param):
    with pytest.raises(ApiError) as caught:
        to_chat_body(raw)
    exc = caught.value
    assert exc.status == 400 and exc.param == param
    assert error_body(exc) == {"type": "error", "error": {"type": "invalid_request_error", "message": exc.message}}
    if param is not None:
        assert exc.message.startswith(param + ": "), exc.message


@pytest.mark.parametrize(("exc", "kind"), [
    (ApiError(401, "key", "invalid_api_key", kind="authentication_error"), "authentication_error"),
    (ApiError(403, "host", "forbidden_host", kind="permission_error"), "permission_error"),
    (ApiError(404, "model", "model_not_found", "model", kind="not_found_error"), "not_found_error"),
    (ApiError(413, "big", "request_too_large"), "request_too_large"),
    (ApiError(503, "busy", "queue_full", kind="server_error"), "overloaded_error"),
    (ApiError(503, "stopped", "server_stopped", kind="server_error"), "api_error"),
    (ApiError(500, "failed", "generation_failed", kind="server_error"), "api_error"),
], ids=lambda v: str(v.status) + "-" + v.code if isinstance(v, ApiError) else "")
def test_an_errors_anthropic_type_follows_its_status(exc, kind):
    assert error_body(exc) == {"type": "error", "error": {"type": kind, "message": exc.message}}


# -- the reply --------------------------------------------------------------------------------------------------


def openai_whole(content: str | None, finish: str = "stop", tool_calls: list[dict] | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL_ID,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_text_reply_is_one_text_block_with_its_usage():
    assert to_message(openai_whole("Hi there"), "msg_1") == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL_ID,
        "content": [{"type": "text", "text": "Hi there"}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 5}}


def test_tool_calls_become_tool_use_blocks_after_the_text():
    whole = openai_whole("Let me look.", "tool_calls", [call("call_1", "weather", '{"city": "Paris"}'),
                                                        call("call_2", "now", "")])
    message = to_message(whole, "msg_1")
    assert message["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "now", "input": {}}]
    assert message["stop_reason"] == "tool_use"
    assert to_message(openai_whole(None, "tool_calls", [call("c", "now", "{}")]), "m")["content"] == [
        {"type": "tool_use", "id": "c", "name": "now", "input": {}}]


def test_tool_call_arguments_that_are_not_an_object_fail_the_reply():
    with pytest.raises(ApiError) as caught:
        to_message(openai_whole(None, "tool_calls", [call("c", "weather", '["Paris"]')]), "m")
    assert caught.value.status == 500 and error_body(caught.value)["error"]["type"] == "api_error"


@pytest.mark.parametrize(("finish", "engine_reason", "matched", "expected"), [
    ("stop", "eog", "", ("end_turn", None)),
    ("stop", "cancelled", "", ("end_turn", None)),
    ("stop", "loop", "", ("end_turn", None)),
    ("length", "max_tokens", "", ("max_tokens", None)),
    ("length", "context_full", "", ("model_context_window_exceeded", None)),
    ("stop", "stop_string", "STOP", ("stop_sequence", "STOP")),
    ("tool_calls", "eog", "", ("tool_use", None)),
], ids=["eog", "cancelled", "loop", "max-tokens", "context-full", "stop-string", "tool-calls"])
def test_the_stop_reason_says_why_the_reply_ended(finish, engine_reason, matched, expected):
    assert stop_of(finish, engine_reason, matched) == expected


def step(text: str, n: int, reason: str | None = None, prompt_tokens: int = 0, stop_string: str = "") -> StepEvent:
    return StepEvent(step=0, mode="plain" if n else "none", token_ids=(7,) * n, text=text, n_committed=n,
                     batch_size=1, n_logits=1, n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0,
                     guesses=0, elapsed_s=0.001, decode_s=0.001, prompt_tokens=prompt_tokens, stop_reason=reason,
                     stop_string=stop_string)


def reply_of(steps: list[StepEvent], **fields: Any) -> Reply:
    reply = Reply(parse_chat(to_chat_body(body(**fields)), MODEL_ID), chat=True, model_id=MODEL_ID)
    for event in steps:
        reply.observe(event)
    return reply


def stream_of(reply: Reply, steps: list[StepEvent]) -> list[dict[str, Any]]:
    """The stream's events as the handler sends them: each step folded into the reply first."""
    message = MessageReply(reply)
    events = []
    for event in steps:
        reply.observe(event)
        events += message.step(event)
    return events + message.finish()


def test_a_streamed_reply_is_anthropics_event_sequence_with_the_text_as_it_came():
    steps = [step("Hel", 1, prompt_tokens=9), step("", 1), step("lo", 1), step("", 0, reason="max_tokens")]
    events = stream_of(reply_of([]), steps)
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "content_block_delta",
                                           "content_block_delta", "content_block_stop", "message_delta",
                                           "message_stop"]
    start = events[0]["message"]
    assert start["content"] == [] and start["usage"] == {"input_tokens": 9, "output_tokens": 0}
    assert start["id"].startswith("msg_") and start["model"] == MODEL_ID and start["stop_reason"] is None
    assert events[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [e["delta"] for e in events[2:4]] == [{"type": "text_delta", "text": "Hel"},
                                                 {"type": "text_delta", "text": "lo"}]
    assert events[5] == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                         "usage": {"input_tokens": 9, "output_tokens": 3}}


def test_a_stream_that_ends_before_a_step_still_starts_and_stops_the_message():
    events = stream_of(reply_of([]), [])
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]


CALL_MARKUP = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_tool_call_is_never_streamed_as_text_and_closes_the_stream_with_its_whole_input():
    reply = reply_of([], tools=[WEATHER_TOOL])
    steps = [step(CALL_MARKUP[:12], 3, prompt_tokens=9), step(CALL_MARKUP[12:], 20), step("", 0, reason="eog")]
    events = stream_of(reply, steps)
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("message_delta", None), ("message_stop", None)]
    block = events[1]["content_block"]
    assert block == {"type": "tool_use", "id": block["id"], "name": "weather", "input": {}}
    assert json.loads(events[2]["delta"]["partial_json"]) == {"city": "Paris"}
    assert events[4]["delta"]["stop_reason"] == "tool_use"
    whole = MessageReply(reply).whole()
    assert whole["content"] == [{**block, "input": {"city": "Paris"}}] and whole["stop_reason"] == "tool_use"


def test_text_that_is_no_tool_call_is_streamed_whole():
    reply = reply_of([], tools=[WEATHER_TOOL])
    events = stream_of(reply, [step("{It is", 2, prompt_tokens=9), step(" sunny.", 2), step("", 0, reason="eog")])
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "{It is sunny."
    assert events[-2]["delta"]["stop_reason"] == "end_turn"


def test_the_stop_string_the_engine_met_is_named():
    reply = reply_of([step("Monday", 1, prompt_tokens=9), step("", 0, reason="stop_string", stop_string="Tuesday")],
                     stop_sequences=["Sunday", "Tuesday"])
    message = MessageReply(reply).whole()
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "Tuesday")


def test_events_are_sent_named_by_their_type():
    assert sse([{"type": "message_stop"}, {"type": "ping"}]) == (
        b'event: message_stop\ndata: {"type": "message_stop"}\n\nevent: ping\ndata: {"type": "ping"}\n\n')


# -- refusals on the route, whichever layer makes them ----------------------------------------------------------


async def _answers(app: web.Application, method: str, path: str, **kwargs: Any) -> tuple[int, dict, Any]:
    """The status, headers and body (JSON when it is) of one request to ``app``."""
    async with TestClient(TestServer(app)) as client:
        response = await client.request(method, path, **kwargs)
        text = await response.text()
        is_json = response.content_type == "application/json"
        return response.status, dict(response.headers), json.loads(text) if is_json else text


def refusing(exc: BaseException, max_body: int = 1024) -> web.Application:
    """An app with only the error middleware, whose routes fail with ``exc`` after reading the body."""
    async def fail(request: web.Request) -> web.Response:
        await request.read()
        raise exc

    app = web.Application(middlewares=[anthropic_errors], client_max_size=max_body)
    app.router.add_post(ROUTE, fail)
    app.router.add_post("/v1/chat/completions", fail)
    return app


def test_a_busy_server_answers_anthropics_overloaded_error_with_retry_after():
    busy = ApiError(503, "the server is busy", "queue_full", kind="server_error", headers={"Retry-After": "7"})
    status, headers, answer = asyncio.run(_answers(refusing(busy), "POST", ROUTE, json=HI))
    assert status == 503 and headers["Retry-After"] == "7"
    assert answer == {"type": "error", "error": {"type": "overloaded_error", "message": "the server is busy"}}


def test_aiohttps_own_refusals_take_anthropics_shape():
    never = ApiError(400, "never", "x")
    status, headers, answer = asyncio.run(_answers(refusing(never), "GET", ROUTE))
    assert (status, headers["Allow"], answer["error"]["type"]) == (405, "POST", "invalid_request_error")
    assert answer["type"] == "error"

    async def chunked():  # no Content-Length: aiohttp refuses it as it reads
        yield b"x" * 64
    status, _, answer = asyncio.run(_answers(refusing(never, max_body=16), "POST", ROUTE, data=chunked()))
    assert (status, answer["error"]["type"]) == (413, "request_too_large")


def test_a_fault_of_the_server_is_anthropics_500_without_its_text():
    status, _, answer = asyncio.run(_answers(refusing(KeyError("secret")), "POST", ROUTE, json=HI))
    assert status == 500 and answer["error"]["type"] == "api_error" and "secret" not in json.dumps(answer)


def test_other_routes_refusals_pass_by_for_the_servers_own_shape():
    status, _, answer = asyncio.run(_answers(refusing(ApiError(400, "nope", "x")), "POST", "/v1/chat/completions",
                                             json=HI))
    assert status == 500 and not isinstance(answer, dict)  # this app has no handler of OpenAI's shape behind it


# -- the real server through Anthropic's client -----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(engine):
    with serving(engine, MODEL_ID) as srv:
        yield srv


@pytest.fixture(scope="module")
def stand_in_server():
    with serving(as_engine(OneWordEngine()), MODEL_ID) as srv:
        yield srv


@pytest.fixture(scope="module")
def key_server():
    with serving(as_engine(OneWordEngine()), MODEL_ID, api_key=API_KEY) as srv:
        yield srv


def client_of(srv: ModelServer, key: str = "unused"):
    return anthropic.Anthropic(base_url=srv.base_url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server):
    with client_of(server) as c:
        yield c


@pytest.fixture(scope="module")
def stand_in_client(stand_in_server):
    with client_of(stand_in_server) as c:
        yield c


@pytest.fixture(scope="module")
def answer(client):
    """One greedy reply to QUESTION, which several tests compare with."""
    return client.messages.create(model=MODEL_ID, max_tokens=24, messages=[{"role": "user", "content": QUESTION}])


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


@pytest.mark.model
def test_a_message_is_answered_with_text_and_its_usage(answer):
    assert answer.type == "message" and answer.role == "assistant" and answer.model == MODEL_ID
    assert answer.id.startswith("msg_")
    assert text_of(answer).strip()
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.stop_sequence is None
    assert answer.usage.input_tokens > 0 and 0 < answer.usage.output_tokens <= 24


@pytest.mark.model
def test_a_streamed_message_has_the_text_of_the_whole_one(client, answer):
    with client.messages.stream(model=MODEL_ID, max_tokens=24,
                                messages=[{"role": "user", "content": QUESTION}],
                                extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(final) == text_of(answer)
    assert final.stop_reason == answer.stop_reason
    assert (final.usage.input_tokens, final.usage.output_tokens) == (answer.usage.input_tokens,
                                                                     answer.usage.output_tokens)


@pytest.mark.model
def test_a_system_prompt_is_read_before_the_messages(engine, client):
    system = "You answer in French."
    message = client.messages.create(model=MODEL_ID, max_tokens=4, system=system,
                                     messages=[{"role": "user", "content": QUESTION}])
    # the runner is idle between requests: the engine is free to render the same chat
    assert message.usage.input_tokens == len(engine.render_chat([Message("system", system),
                                                                 Message("user", QUESTION)]))


@pytest.mark.model
def test_a_stop_sequence_ends_the_text_before_it_and_is_named(client, answer):
    text = text_of(answer)
    stop = text.split()[1]
    message = client.messages.create(model=MODEL_ID, max_tokens=24, stop_sequences=[stop],
                                     messages=[{"role": "user", "content": QUESTION}])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    assert text_of(message) == text[:text.index(stop)]
    # of several, the one met is named: here the later of two in the text, given first
    later = text.split()[3]
    message = client.messages.create(model=MODEL_ID, max_tokens=24, stop_sequences=[later, stop],
                                     messages=[{"role": "user", "content": QUESTION}])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)


def test_the_key_is_taken_from_x_api_key_and_a_wrong_one_is_anthropics_401(key_server):
    with client_of(key_server, API_KEY) as right:
        assert right.messages.create(**HI).usage.output_tokens > 0
    with client_of(key_server, "secret-key-124") as wrong, pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(**HI)
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("fields", "error", "kind"), [
    ({"messages": user(IMAGE)}, "BadRequestError", "invalid_request_error"),  # refused by the translation
    ({"extra_body": {"temperature": 3}}, "BadRequestError", "invalid_request_error"),  # refused by parse_chat
], ids=["image-block", "temperature-3"])
def test_a_bad_request_is_anthropics_error_to_its_client(stand_in_client, fields, error, kind):
    with pytest.raises(getattr(anthropic, error)) as caught:
        stand_in_client.messages.create(**{**HI, **fields})
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == kind


def test_a_client_that_names_its_own_default_model_is_answered_by_the_served_one(stand_in_client):
    message = stand_in_client.messages.create(**{**HI, "model": "claude-sonnet-4-5"})
    assert message.model == MODEL_ID
    assert message.content[0].text


def post(srv: ModelServer, method: str, payload: Any = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        data = None if payload is None else json.dumps(payload).encode()
        conn.request(method, ROUTE, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_over_raw_http_a_missing_max_tokens_and_a_wrong_method_are_anthropics_errors(stand_in_server):
    status, answer = post(stand_in_server, "POST", {k: v for k, v in HI.items() if k != "max_tokens"})
    assert status == 400 and answer == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: is required"}}
    status, answer = post(stand_in_server, "GET")
    assert status == 405 and answer["type"] == "error"
