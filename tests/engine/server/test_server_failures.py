"""The local server when something goes wrong on its side: a fault of ours is a 500 (or, in a stream that has
begun, an error event) that tells the client nothing of it, and the server goes on; stopping without waiting
returns at once whatever the clients do, answers them all, and the port serves again.

No model: the engine is a stand-in that says one word per generation, and can hold its generation until it is
cancelled, so a request is running for as long as a test needs at any CPU speed.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

import pytest

from engine.server.api import ModelServer
from tests.helpers.fake_engine import as_engine
from tests.helpers.serving import HOLD_S, OneWordEngine
from tests.helpers.serving import serving as serving_engine

MODEL_ID = "stand-in"
CHAT = "/v1/chat/completions"
SECRET = "secret text"
QUESTION = "a question only the client may read"
BODY = {"model": MODEL_ID, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
INTERNAL_ERROR = {"error": {"message": "the server failed to answer this request", "type": "server_error",
                            "param": None, "code": "internal_error"}}
WAIT_S = 30  # generous: how long a server may take to notice something, whatever the CPU


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(engine: OneWordEngine, port: int = 0) -> AbstractContextManager[ModelServer]:
    """A server on ``engine``, stopped (and its engine let go) whatever happens."""
    return serving_engine(as_engine(engine), MODEL_ID, host="127.0.0.1", port=port)


def post(port: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """One request on a connection of its own: status, content type, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HOLD_S)
    try:
        conn.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.headers.get_content_type(), response.read()
    finally:
        conn.close()


def stream_events(body: bytes) -> list[Any]:
    """A stream's ``data:`` events, ``[DONE]`` as the string it is."""
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-300:]
    events = [event.removeprefix("data: ") for event in text.split("\n\n") if event]
    return [*map(json.loads, events[:-1]), events[-1]]


def in_thread(fn: Any, *args: Any) -> dict[str, Any]:
    """Run ``fn`` on a thread; its result lands in the dict."""
    out: dict[str, Any] = {}
    out["thread"] = threading.Thread(target=lambda: out.setdefault("result", fn(*args)), daemon=True)
    out["thread"].start()
    return out


def answered(call: dict[str, Any]) -> Any:
    call["thread"].join(WAIT_S)
    assert "result" in call, "the client was not answered"
    return call["result"]


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S} s"
        time.sleep(0.01)


def fail(*args: Any) -> None:
    raise RuntimeError(SECRET)


# -- a fault of ours ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_fault_in_a_handler_is_a_500_that_tells_nothing_and_the_server_goes_on(monkeypatch, caplog, stream):
    with serving(OneWordEngine()) as server:
        monkeypatch.setattr(server.runner, "submit", fail)  # before any byte of the answer went
        with caplog.at_level(logging.INFO, logger="engine.server"):
            status, content_type, body = post(server.port, {**BODY, "stream": stream})
        assert (status, content_type) == (500, "application/json"), body[:300]
        assert json.loads(body) == INTERNAL_ERROR
        assert SECRET.encode() not in body
        assert server.stats.refused == 1
        [failure] = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert failure.exc_info is not None, "the log has the traceback"
        assert f"POST {CHAT} 500" in caplog.text, "the request's one log line"
        assert QUESTION not in caplog.text, "the log never holds what was asked"

        monkeypatch.undo()
        status, _, body = post(server.port, BODY)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "Hi"


def test_a_fault_in_a_stream_that_began_ends_it_with_an_error_event_and_done(monkeypatch, caplog):
    with serving(OneWordEngine()) as server:
        monkeypatch.setattr(server, "_served", fail)  # after the stream's headers and its text went
        with caplog.at_level(logging.INFO, logger="engine.server"):
            status, content_type, body = post(server.port, {**BODY, "stream": True})
        assert (status, content_type) == (200, "text/event-stream")
        assert SECRET.encode() not in body
        events = stream_events(body)
        assert events[-2:] == [INTERNAL_ERROR, "[DONE]"]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-2]) == "Hi"
        assert [r.exc_info is not None for r in caplog.records if r.levelno >= logging.ERROR] == [True]
        assert QUESTION not in caplog.text, "the log never holds what was asked"

        monkeypatch.undo()
        status, _, body = post(server.port, {**BODY, "stream": True})
        assert status == 200 and stream_events(body)[-2]["choices"][0]["finish_reason"] == "stop"


# -- stopping without waiting -----------------------------------------------------------------------------------


@pytest.mark.timing
def test_stopping_without_waiting_returns_at_once_answers_everyone_and_the_port_serves_again():
    engine = OneWordEngine()
    engine.hold = True
    port = free_port()
    with serving(engine, port) as server, socket.create_connection(("127.0.0.1", port)) as stalled:
        # A client that sends half its body and then nothing: a stop that waited would wait on it for seconds.
        stalled.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                        "Content-Length: 1000\r\n\r\n{".encode())
        streaming = in_thread(post, port, {**BODY, "stream": True})
        until(lambda: server.stats.running, "the streamed generation's start")
        waiting = in_thread(post, port, BODY)
        until(lambda: server.stats.waiting == 1, "the second request's arrival")

        start = time.perf_counter()
        server.stop("stopped for this test", wait=False)
        assert time.perf_counter() - start < 0.5
        assert not server.running
        with pytest.raises(ConnectionRefusedError):  # the port is closed when stop returns
            socket.create_connection(("127.0.0.1", port)).close()

        status, _, body = answered(streaming)
        error = stream_events(body)[-2]["error"]
        assert status == 200 and (error["code"], error["message"]) == ("server_stopped", "stopped for this test")
        status, _, body = answered(waiting)
        assert status == 503 and json.loads(body)["error"]["message"] == "stopped for this test"

        stalled.close()  # else the old thread gives up on it only after its shutdown timeouts
        engine.hold = False
        server.start()  # the same server, the same port (it waits for the thread that was ending)
        assert server.port == port and post(port, BODY)[0] == 200
        server.stop(wait=False)
        server.join()
        with serving(engine, port) as another:  # a new server on the port, once the old thread has ended
            assert post(another.port, BODY)[0] == 200
