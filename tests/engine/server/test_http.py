"""The local server over raw HTTP: bad requests get OpenAI's error object and the exact status, and the server
goes on serving after each one.

A table of bad (and a few allowed) requests, sent with ``http.client`` for full control of the method, the
headers and the body; after each one a normal small chat request must still be answered. Then what the table
cannot say: a prompt longer than the context, the shape of a stream, a full queue, and a client that leaves
in the middle of a stream. Nothing here depends on how fast the machine decodes: where a test needs a
generation to be running while it sends more, the engine is held after its first step until the test lets
it go.

What the server decides alone (routes, the body, the key, the Host and Origin checks, its queue) is asked of a
server on a stand-in that says one word (``OneWordEngine``); what the engine takes part in (a sampler setting,
the context's length, a stream of many steps, a generation stopped midway) of one on the bundled model.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from engine import GenerationControls, SamplingConfig, StepEvent, StopConfig
from engine.decoding.grammar import Constraint
from engine.decoding.text import Message
from engine.llama.problems import SettingsError
from engine.server import EngineRunner, ServerConfig, ServerStats
from engine.server.api import ModelServer
from tests.helpers.fake_engine import Generating, as_engine
from tests.helpers.serving import HOLD_S, OneWordEngine

MODEL_ID = "bundled"
API_KEY = "secret-key-123"
GOOD_ORIGIN = "http://good.example"
EVIL_ORIGIN = "http://evil.example"
SMALL_BODY_LIMIT = 4096
CHAT = "/v1/chat/completions"
HI = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
STORY = [{"role": "user", "content": "Write a very long story"}]
TIMINGS = {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "draft_n",
           "draft_n_accepted"}
WAIT_S = 30  # generous: how long a server may take to notice something, whatever the CPU


# -- the engine as the server's runner sees it ------------------------------------------------------------------


@dataclass
class Generation:
    """One generation the runner ran: its tokens so far, how it ended, and whether it ended."""

    tokens: int = 0
    stop_reason: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class WatchedEngine(Generating):
    """An engine (the shared one, or a stand-in), recording each generation the runner runs on it.

    With ``hold``, every generation pauses after its first step until ``hold`` is set: the test then knows a
    generation is running (the server has sent its first chunk) for as long as it needs, at any CPU speed.
    """

    def __init__(self, engine: Any, hold: threading.Event | None = None) -> None:
        self._engine = engine
        self.hold = hold
        self.generations: list[Generation] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(
        self,
        prompt: Sequence[int],
        controls: GenerationControls | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        stop: StopConfig = StopConfig(),
        history: Sequence[int] = (),
        notice: str = "",
        record_gaps: bool = False,
        exact_only: bool = True,
        constraint: Constraint | None = None,
    ) -> Iterator[StepEvent]:
        events = self._engine.generate(prompt, controls, sampling, stop, history, notice, record_gaps, exact_only,
                                       constraint)
        generation = Generation()
        self.generations.append(generation)
        return self._follow(events, generation)

    def _follow(self, events: Iterator[StepEvent], generation: Generation) -> Iterator[StepEvent]:
        try:
            for i, event in enumerate(events):
                generation.tokens += len(event.token_ids)
                generation.stop_reason = event.stop_reason or generation.stop_reason
                yield event
                if i == 0 and self.hold is not None:
                    self.hold.wait(HOLD_S)
        finally:
            generation.done.set()


@contextmanager
def serving(engine: Any, hold: threading.Event | None = None,
            on_change: Callable[[ServerStats], None] | None = None, **config: Any) -> Iterator[ModelServer]:
    """A server of its own on ``engine`` (port 0: a free one), stopped whatever happens."""
    runner = EngineRunner(as_engine(WatchedEngine(engine, hold)))
    try:
        server = ModelServer(runner, MODEL_ID, ServerConfig(host="127.0.0.1", port=0, **config), on_change=on_change)
        server.start()
        try:
            yield server
        finally:
            if hold is not None:
                hold.set()
            server.stop()
    finally:
        runner.close()


def watched(server: ModelServer) -> WatchedEngine:
    runner = server.runner
    assert isinstance(runner, EngineRunner) and isinstance(runner.engine, WatchedEngine)
    return runner.engine


@pytest.fixture(scope="module")
def server():
    with serving(OneWordEngine()) as srv:
        yield srv


@pytest.fixture(scope="module")
def key_server():
    with serving(OneWordEngine(), api_key=API_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def cors_server():
    with serving(OneWordEngine(), allowed_origins=(GOOD_ORIGIN,)) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_body_server():
    with serving(OneWordEngine(), max_body_bytes=SMALL_BODY_LIMIT) as srv:
        yield srv


@pytest.fixture(scope="module")
def model_server(engine):
    with serving(engine) as srv:
        yield srv


# -- raw HTTP ---------------------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def send(server: ModelServer, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
         chunked: bool = False) -> Reply:
    """One request on a connection of its own. ``body``: bytes as they are, anything else as JSON; ``chunked``
    sends it in 1 KiB chunks without a Content-Length."""
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode("utf-8")
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        if chunked:
            data = body or b""
            pieces = (data[i:i + 1024] for i in range(0, len(data), 1024))
            conn.request(method, path, body=pieces, headers=all_headers, encode_chunked=True)
        else:
            conn.request(method, path, body=body, headers=all_headers)
        response = conn.getresponse()
        try:
            return Reply(response.status, response.headers, response.read())
        finally:
            response.close()
    finally:
        conn.close()


def key_headers(server: ModelServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.config.api_key}"} if server.config.api_key else {}


def assert_answers(reply: Reply) -> dict[str, Any]:
    """A chat completion with a non-empty assistant message."""
    assert reply.status == 200, reply.body[:500]
    assert reply.headers.get_content_type() == "application/json"
    body = reply.json()
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str) and message["content"], body
    return body


def assert_still_serving(server: ModelServer) -> None:
    """A normal small request is answered: the bad one before it left the server working."""
    assert_answers(send(server, "POST", CHAT, HI, key_headers(server)))


def assert_openai_error(reply: Reply, status: int, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``, naming the field at fault."""
    assert reply.status == status, reply.body[:500]
    assert reply.headers.get_content_type() == "application/json", (reply.headers, reply.body[:500])
    body = reply.json()
    assert isinstance(body, dict) and list(body) == ["error"], body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert isinstance(error["type"], str) and error["type"], error
    assert isinstance(error["code"], str) and error["code"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


# -- the table --------------------------------------------------------------------------------------------------


def chat(**fields: Any) -> dict[str, Any]:
    """The small normal request with ``fields`` changed."""
    return {**HI, **fields}


def chat_without(name: str) -> dict[str, Any]:
    return {k: v for k, v in HI.items() if k != name}


def user_then(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    return [*messages, {"role": "user", "content": "Say hi"}]


HUGE_BODY = (b'{"model": "bundled", "messages": [{"role": "user", "content": "'
             + b"a" * (2 * 1024 * 1024) + b'"}], "max_tokens": 4}')
OVER_SMALL_LIMIT = json.dumps(chat(messages=[{"role": "user", "content": "a" * (4 * SMALL_BODY_LIMIT)}])).encode()
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}


@dataclass(frozen=True)
class Case:
    """One request and what the server must answer. ``headers`` may hold ``{port}``; ``server`` names the
    fixture of the server it goes to (``model_server``: the engine takes part, the test needs the model);
    ``has``/``lacks`` are response headers that must / must not be there."""

    id: str
    body: Any = None
    status: int = 400
    code: str | None = None
    param: str | None = None
    method: str = "POST"
    path: str = CHAT
    headers: dict[str, str] = field(default_factory=dict)
    server: str = "server"
    chunked: bool = False
    has: dict[str, str] = field(default_factory=dict)
    lacks: tuple[str, ...] = ()


CASES = [
    # routes
    Case("get-chat-completions", method="GET", status=405, code="method_not_allowed", has={"Allow": "POST"}),
    Case("post-health", method="POST", path="/health", body=HI, status=405, code="method_not_allowed"),
    Case("post-unknown-path", path="/v1/nothing", body=HI, status=404, code="not_found"),
    Case("get-unknown-model", method="GET", path="/v1/models/gpt-4o", status=404, code="model_not_found",
         param="model"),
    # the body as JSON
    Case("malformed-json", body=b'{"model": "bundled", "messages": [', code="invalid_json"),
    Case("empty-body", body=b"", code="invalid_json"),
    Case("body-not-utf8", body=b'{"model": "\xff\xfe"}', code="invalid_json"),
    Case("body-json-array", body=[HI], code="invalid_json"),
    Case("body-json-string", body="hello", code="invalid_json"),
    Case("json-nested-too-deep", body=b"[" * 100_000 + b"]" * 100_000, code="invalid_json"),
    Case("json-int-5000-digits", body=b'{"model": "bundled", "max_tokens": ' + b"9" * 5000 + b"}",
         code="invalid_json"),
    # messages
    Case("messages-missing", body=chat_without("messages"), code="missing_field", param="messages"),
    Case("messages-not-a-list", body=chat(messages="Say hi"), param="messages"),
    Case("messages-empty", body=chat(messages=[]), param="messages"),
    Case("message-not-an-object", body=chat(messages=["Say hi"]), param="messages[0]"),
    Case("message-role-tool", body=chat(messages=user_then({"role": "tool", "content": "42",
                                                             "tool_call_id": "call_1"})),
         param="messages[0].tool_call_id"),
    Case("message-image-url-part", body=chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]),
         code="unsupported_parameter", param="messages[0].content[0]"),
    Case("message-content-number", body=chat(messages=[{"role": "user", "content": 5}]),
         param="messages[0].content"),
    Case("message-tool-calls", body=chat(messages=[
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
        {"role": "user", "content": "Say hi"}]), param="messages[0].tool_calls[0]"),
    Case("tool-message-without-id", body=chat(messages=[{"role": "user", "content": "Say hi"},
                                                        {"role": "tool", "content": "7"}]),
         code="missing_field", param="messages[1].tool_call_id"),
    Case("last-message-assistant", body=chat(messages=[{"role": "user", "content": "Say hi"},
                                                       {"role": "assistant", "content": "Hello"}]),
         param="messages[1]"),
    # wrong types and ranges
    Case("model-not-a-string", body=chat(model=5), param="model"),
    Case("temperature-hot", body=chat(temperature="hot"), param="temperature"),
    Case("temperature-nan", body=b'{"messages": [{"role": "user", "content": "Say hi"}], "temperature": NaN}',
         param="temperature"),
    Case("temperature-3", body=chat(temperature=3), param="temperature"),
    Case("max-tokens-negative", body=chat(max_tokens=-1), param="max_tokens"),
    Case("max-tokens-zero", body=chat(max_tokens=0), param="max_tokens"),
    Case("max-tokens-fraction", body=chat(max_tokens=1.5), param="max_tokens"),
    Case("max-completion-tokens-string", body=chat(max_completion_tokens="4"), param="max_completion_tokens"),
    Case("top-p-zero", body=chat(top_p=0), param="top_p"),
    Case("top-k-bool", body=chat(top_k=True), param="top_k"),
    Case("seed-negative", body=chat(seed=-1), param="seed"),
    Case("dry-negative", body=chat(dry_multiplier=-0.5), param="dry_multiplier"),
    Case("dry-base-one", body=chat(dry_multiplier=0.8, dry_base=1.0), param="dry_base"),
    Case("dry-allowed-zero", body=chat(dry_multiplier=0.8, dry_allowed_length=0), param="dry_allowed_length"),
    Case("dry-ok", body=chat(dry_multiplier=0.8, dry_base=1.5, dry_allowed_length=3), status=200,
         server="model_server"),
    Case("stop-number", body=chat(stop=5), param="stop"),
    Case("stop-empty-string", body=chat(stop=[""]), param="stop"),
    Case("stream-yes", body=chat(stream="yes"), param="stream"),
    Case("stream-options-without-stream", body=chat(stream_options={"include_usage": True}),
         param="stream_options"),
    # what the engine does not do
    Case("n-2", body=chat(n=2), code="unsupported_parameter", param="n"),
    Case("logprobs-true", body=chat(logprobs=True), code="unsupported_parameter", param="logprobs"),
    Case("tools", body=chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
         code="unsupported_parameter", param="tools", server="model_server"),  # the model's template takes none
    Case("response-format-yaml", body=chat(response_format={"type": "yaml"}), param="response_format"),
    Case("response-format-and-grammar", body=chat(response_format={"type": "json_object"}, grammar='root ::= "a"'),
         code="unsupported_parameter", param="grammar"),
    Case("another-model-is-answered-by-the-served-one", body=chat(model="gpt-4o"), status=200),
    Case("lookahead-fast", body=chat(lookahead="fast"), param="lookahead"),
    Case("lookahead-window-99", body=chat(lookahead={"window": 99}), param="lookahead.window"),
    Case("lookahead-unknown-key", body=chat(lookahead={"speed": 3}), param="lookahead.speed"),
    Case("completions-prompt-missing", path="/v1/completions", body={"model": MODEL_ID, "max_tokens": 4},
         code="missing_field", param="prompt"),
    Case("completions-two-prompts", path="/v1/completions", body={"model": MODEL_ID, "prompt": ["a", "b"]},
         param="prompt"),
    # body size
    Case("body-over-2mib", body=HUGE_BODY, status=413, code="request_too_large"),
    Case("chunked-body-over-limit", body=OVER_SMALL_LIMIT, chunked=True, status=413, code="request_too_large",
         server="small_body_server"),
    Case("chunked-body-under-limit", body=HI, chunked=True, status=200, server="small_body_server"),
    # API key
    Case("key-missing", body=HI, status=401, code="invalid_api_key", server="key_server"),
    Case("key-wrong", body=HI, headers={"Authorization": "Bearer secret-key-124"}, status=401,
         code="invalid_api_key", server="key_server"),
    Case("key-not-bearer", body=HI, headers={"Authorization": API_KEY}, status=401, code="invalid_api_key",
         server="key_server"),
    Case("key-right", body=HI, headers={"Authorization": f"Bearer {API_KEY}"}, status=200, server="key_server"),
    Case("key-missing-health", method="GET", path="/health", status=200, server="key_server"),
    # Host (DNS rebinding)
    Case("host-foreign", body=HI, headers={"Host": "evil.example:{port}"}, status=403, code="forbidden_host"),
    Case("host-lookalike", body=HI, headers={"Host": "localhost.evil.example:{port}"}, status=403,
         code="forbidden_host"),
    Case("host-localhost", body=HI, headers={"Host": "localhost:{port}"}, status=200),
    # CORS
    Case("preflight-evil-origin", method="OPTIONS", headers={"Origin": EVIL_ORIGIN, **PREFLIGHT}, status=403,
         code="forbidden_origin", lacks=("Access-Control-Allow-Origin",)),
    Case("post-evil-origin", body=HI, headers={"Origin": EVIL_ORIGIN}, status=403, code="forbidden_origin",
         lacks=("Access-Control-Allow-Origin",)),
    Case("post-evil-origin-to-cors-server", body=HI, headers={"Origin": EVIL_ORIGIN}, status=403,
         code="forbidden_origin", server="cors_server", lacks=("Access-Control-Allow-Origin",)),
    Case("preflight-good-origin", method="OPTIONS", headers={"Origin": GOOD_ORIGIN, **PREFLIGHT}, status=204,
         server="cors_server", has={"Access-Control-Allow-Origin": GOOD_ORIGIN}),
    Case("post-good-origin", body=HI, headers={"Origin": GOOD_ORIGIN}, status=200, server="cors_server",
         has={"Access-Control-Allow-Origin": GOOD_ORIGIN}),
    # A page allowed to call must be able to read why it was refused (else the browser hides the error).
    Case("good-origin-refusal-readable", body=chat(max_tokens=-1), headers={"Origin": GOOD_ORIGIN},
         param="max_tokens", server="cors_server", has={"Access-Control-Allow-Origin": GOOD_ORIGIN}),
]


def as_param(case: Case) -> Any:
    """``case`` as a test, marked ``model`` where it goes to the model's server."""
    return pytest.param(case, id=case.id, marks=[pytest.mark.model] if case.server == "model_server" else [])


@pytest.mark.parametrize("case", [as_param(c) for c in CASES])
def test_bad_request_is_refused_and_the_server_goes_on(request, case: Case):
    srv: ModelServer = request.getfixturevalue(case.server)
    headers = {k: v.format(port=srv.port) for k, v in case.headers.items()}
    reply = send(srv, case.method, case.path, case.body, headers, chunked=case.chunked)
    if case.status >= 400:
        assert_openai_error(reply, case.status, case.code, case.param)
    else:
        assert reply.status == case.status, reply.body[:500]
        if case.method == "POST" and case.path == CHAT:
            assert_answers(reply)
        elif case.path == "/health":
            assert reply.json()["status"] == "ok"
    for name, value in case.has.items():
        assert reply.headers.get(name) == value, (name, dict(reply.headers))
    for name in case.lacks:
        assert name not in reply.headers, (name, dict(reply.headers))
    assert_still_serving(srv)


# -- what the table cannot say ----------------------------------------------------------------------------------


@pytest.mark.model
def test_prompt_longer_than_the_context_is_refused_with_both_numbers(engine, model_server):
    words = " ".join(f"word{i}" for i in range(5000))
    n_prompt = len(engine.render_chat([Message("user", words)]))  # the runner is idle: the engine is free
    assert n_prompt > engine.n_ctx == 4096
    reply = send(model_server, "POST", CHAT, chat(messages=[{"role": "user", "content": words}]))
    error = assert_openai_error(reply, 400, "context_length_exceeded", "messages")
    assert str(n_prompt) in error["message"] and "4096" in error["message"], error
    assert_still_serving(model_server)


async def _read_stream(server: ModelServer, body: dict[str, Any]) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session:
        async with session.post(server.base_url + "/chat/completions", json=body) as response:
            return response.status, response.headers.get("Content-Type", ""), (await response.read()).decode()


@pytest.mark.model
@pytest.mark.parametrize("include_usage", [False, True], ids=["plain", "with-usage"])
def test_stream_is_server_sent_events_ending_in_done(model_server, include_usage):
    body = chat(max_tokens=12, stream=True)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    status, content_type, text = asyncio.run(_read_stream(model_server, body))
    assert status == 200, text[:500]
    assert content_type.split(";")[0].strip() == "text/event-stream"
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == ""
    lines = [line for event in events[:-1] for line in event.split("\n")]
    assert lines and all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    if include_usage:
        usage_chunk = chunks.pop()
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
        assert TIMINGS <= set(usage_chunk["timings"])
    last = chunks[-1]
    assert last["object"] == "chat.completion.chunk"
    assert last["choices"][0]["finish_reason"] in ("stop", "length"), last
    assert TIMINGS <= set(last["timings"]), last["timings"]
    assert last["timings"]["predicted_n"] > 0
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks), "the stream carried text"
    assert_still_serving(model_server)


async def _post(session: aiohttp.ClientSession, server: ModelServer, body: dict[str, Any]) -> tuple[int, dict, bytes]:
    async with session.post(server.base_url + "/chat/completions", json=body) as response:
        return response.status, dict(response.headers), await response.read()


async def _fill_the_queue(server: ModelServer, hold: threading.Event) -> list[tuple[int, dict, bytes]]:
    """A streamed generation runs (held after its first step); two more come at once: one waits, one is
    refused. Then the held one goes on, and the waiting one is answered. Returns (refused, answered, stream)."""
    async with aiohttp.ClientSession() as session:
        body = chat(messages=STORY, max_tokens=32, stream=True, lookahead="off")
        async with session.post(server.base_url + "/chat/completions", json=body) as first:
            assert first.status == 200
            line = await asyncio.wait_for(first.content.readline(), WAIT_S)
            assert line.startswith(b"data: "), line  # the first step ran: the generation is running
            tasks = [asyncio.create_task(_post(session, server, chat(max_tokens=16))) for _ in range(2)]
            try:
                done, pending = await asyncio.wait(tasks, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
                assert len(done) == 1 and len(pending) == 1, "one request is refused at once, the other waits"
                refused = done.pop().result()
                hold.set()
                rest = await asyncio.wait_for(first.read(), HOLD_S)
                answered = await asyncio.wait_for(pending.pop(), HOLD_S)
            finally:
                hold.set()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    return [refused, answered, (first.status, {}, line + rest)]


def test_full_queue_refuses_with_503_and_retry_after():
    hold = threading.Event()
    with serving(OneWordEngine(), hold, max_waiting=1) as srv:
        (status, headers, body), answered, stream = asyncio.run(_fill_the_queue(srv, hold))
        reply = Reply(status, http.client.HTTPMessage(), body)
        reply.headers["Content-Type"] = headers.get("Content-Type", "")
        assert_openai_error(reply, 503, "queue_full")
        assert int(headers["Retry-After"]) >= 1, headers
        assert answered[0] == 200, answered
        assert json.loads(answered[2])["choices"][0]["message"]["content"]
        assert stream[2].endswith(b"data: [DONE]\n\n"), stream[2][-200:]
        assert_still_serving(srv)
        assert_still_serving(srv)


async def _leave_while_waiting(server: ModelServer, hold: threading.Event, changes: list) -> tuple[int, bytes]:
    """A generation runs (held); a second request waits, then its client leaves; a third comes."""

    async def changed(since: int, what: str) -> None:
        for _ in range(WAIT_S * 50):
            if len(changes) > since:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the server did not tell of {what} within {WAIT_S} s")

    async with aiohttp.ClientSession() as session:
        body = chat(messages=STORY, max_tokens=16, stream=True, lookahead="off")
        async with session.post(server.base_url + "/chat/completions", json=body) as first:
            assert first.status == 200
            assert (await asyncio.wait_for(first.content.readline(), WAIT_S)).startswith(b"data: ")
            # the second request, on a raw connection the test closes while it waits
            n = len(changes)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            data = json.dumps(HI).encode()
            writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
            await writer.drain()
            await changed(n, "the second request")  # taken into the queue
            n = len(changes)
            writer.close()
            await writer.wait_closed()
            await changed(n, "the second client leaving")  # its handler ended
            # the third: the queue is empty again, so it must wait its turn, not be refused
            n = len(changes)
            third = asyncio.create_task(_post(session, server, HI))
            try:
                await changed(n, "the third request")  # taken or refused: decided
                hold.set()
                status, _, answer = await asyncio.wait_for(third, HOLD_S)
                await asyncio.wait_for(first.read(), HOLD_S)
            finally:
                hold.set()
                third.cancel()
                await asyncio.gather(third, return_exceptions=True)
    return status, answer


def test_a_waiting_client_that_leaves_frees_its_place():
    hold = threading.Event()
    changes: list[tuple[int, bool]] = []

    def on_change(stats: ServerStats) -> None:
        changes.append((stats.waiting, stats.running))

    with serving(OneWordEngine(), hold, on_change=on_change, max_waiting=1) as srv:
        status, answer = asyncio.run(_leave_while_waiting(srv, hold, changes))
        assert status == 200, f"refused though nobody was waiting: {answer[:300]!r}"
        assert_still_serving(srv)


def test_max_waiting_zero_still_serves_one_request_at_a_time():
    config = ServerConfig(port=0, max_waiting=0)
    try:
        config.validate()
    except SettingsError:
        return  # refusing the setting is fine too; accepting it and then refusing every request is not
    with serving(OneWordEngine(), max_waiting=0) as srv:
        reply = send(srv, "POST", CHAT, HI)
        assert reply.status == 200, f"an idle server with max_waiting=0 refused: {reply.body[:300]!r}"


async def _read_two_chunks_and_leave(server: ModelServer) -> None:
    async with aiohttp.ClientSession() as session:
        body = chat(messages=STORY, max_tokens=2000, stream=True, lookahead="off")
        response = await session.post(server.base_url + "/chat/completions", json=body)
        try:
            assert response.status == 200
            chunks = 0
            while chunks < 2:
                line = await asyncio.wait_for(response.content.readline(), WAIT_S)
                assert line, "the stream ended early"
                chunks += line.startswith(b"data: ")
        finally:
            response.close()  # drops the connection mid-stream


@pytest.mark.model
@pytest.mark.timing
def test_client_gone_mid_stream_stops_the_generation(model_server):
    generations = watched(model_server).generations
    before = len(generations)
    asyncio.run(_read_two_chunks_and_leave(model_server))
    assert len(generations) == before + 1
    dropped = generations[-1]
    assert dropped.done.wait(WAIT_S), "the generation went on after its client left"
    assert dropped.stop_reason == "cancelled", dropped
    assert dropped.tokens < 2000, dropped
    start = time.monotonic()
    assert_still_serving(model_server)
    assert time.monotonic() - start < WAIT_S


@pytest.mark.model
@pytest.mark.timing
def test_stopping_the_server_mid_generation_ends_it_without_an_error(engine, caplog):
    """The model goes away (the app changes it, or closes) while a stream runs: the client hears why in its
    stream, the generation stops at its next step, and nothing fails on the engine's side afterwards."""
    hold = threading.Event()
    runner = EngineRunner(as_engine(WatchedEngine(engine, hold)))
    server = ModelServer(runner, MODEL_ID, ServerConfig(host="127.0.0.1", port=0))
    server.start()
    result: dict[str, Any] = {}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HOLD_S)
        try:
            conn.request("POST", CHAT, json.dumps(chat(messages=STORY, max_tokens=200, stream=True)),
                         {"Content-Type": "application/json"})
            response = conn.getresponse()
            result["status"], result["body"] = response.status, response.read()
        finally:
            conn.close()

    thread = threading.Thread(target=client, daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + WAIT_S
        generations = watched(server).generations
        while not (generations and generations[0].tokens) and time.monotonic() < deadline:
            time.sleep(0.01)  # the first step ran; the generation is held after it
        assert generations and generations[0].tokens, "the generation started"
        server.stop("the model is being changed for this test")
        hold.set()
        assert generations[0].done.wait(WAIT_S)
        thread.join(WAIT_S)
    finally:
        hold.set()
        server.stop()
        runner.close()
    assert generations[0].stop_reason == "cancelled" and generations[0].tokens < 200
    assert result["status"] == 200 and b"the model is being changed for this test" in result["body"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
