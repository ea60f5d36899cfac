"""Model → Serve to other programs, in a real window on the bundled model: the server starts with the model, takes
turns with the chat on the one engine, keeps its requests out of the chats, and hears when the model changes."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from PySide6.QtGui import QGuiApplication

from engine.server.config import ServedModel
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, quick_settings

pytestmark = pytest.mark.model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, key: str = "", timeout: float = 120) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def in_thread(fn, *args) -> dict:
    """Run ``fn`` on a thread (the GUI's event loop keeps running); the result lands in the dict."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", fn(*args)), daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def hello(model: str, max_tokens: int = 8) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens}


def counting_request(qtbot, server, max_tokens: int) -> dict:
    """A raw completion that counts on (no reply's end stops it), running on the engine when this returns."""
    body = {"model": server.model_id, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": max_tokens}
    call = in_thread(post, f"{server.base_url}/completions", body)
    qtbot.waitUntil(lambda: server.stats.running or "result" in call, timeout=60_000)
    assert "result" not in call, f"the request ended before the test went on: {call['result']}"
    return call


def test_serving_starts_with_the_model_and_its_requests_are_not_chats(qtbot, make_window):
    port = free_port()
    window = make_window(quick_settings(serve_on=True, serve_port=port))
    serving = window.serving
    qtbot.waitUntil(lambda: serving.running, timeout=10_000)
    assert serving.base_url == f"http://127.0.0.1:{port}/v1"
    assert window.serving_label.isVisible() and serving.base_url in window.serving_label.toolTip()
    chats_before = len(window.store.conversations())
    model_id = window.serving.server.model_id
    # listed as ``engine serve`` lists it: by the file's name and time, the same after a restart
    assert window.serving.server.created == ServedModel.of_file(window.serving.model.path).created
    assert model_id == ServedModel.of_file(window.serving.model.path).id

    call = in_thread(post, f"{serving.base_url}/chat/completions", hello(model_id))
    qtbot.waitUntil(lambda: "result" in call, timeout=120_000)
    status, body = call["result"]
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    assert body["timings"]["predicted_n"] == body["usage"]["completion_tokens"] > 0

    # the chat goes on on the same engine, and the request left no chat behind
    window.chat_pane.input.setPlainText("Hi")
    window.send_message()
    qtbot.waitUntil(lambda: not window.is_generating(), timeout=120_000)
    assert len(window.store.conversations()) == chats_before + 1


def test_the_dialog_switches_serving_off_and_on_and_copies_the_address(qtbot, make_window):
    port = free_port()
    window = make_window(quick_settings(serve_port=port))
    assert not window.serving.running and not window.serving_label.isVisible()
    dialog = window.show_serve_dialog()
    assert dialog.address_edit.text() == "" and not dialog.copy_address.isEnabled()

    dialog.serve_box.setChecked(True)
    qtbot.waitUntil(lambda: window.serving.running, timeout=10_000)
    assert dialog.address_edit.text() == f"http://127.0.0.1:{port}/v1"
    assert window.settings.serve_on
    dialog.copy_address.click()
    assert QGuiApplication.clipboard().text() == dialog.address_edit.text()
    assert window.serving.server.model_id in dialog.state_label.text()
    served = dialog.served_label.text()  # the bundled model's template takes no tools: the dialog says so
    assert "/v1/chat/completions" in served and "/v1/messages" in served and "not with this model" in served

    dialog.key_box.setChecked(True)  # a key from now on: the server restarts with it
    key = window.settings.serve_key
    assert key and dialog.key_edit.text() == key
    status, body = post(f"http://127.0.0.1:{port}/v1/chat/completions", hello(window.serving.server.model_id))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"

    dialog.serve_box.setChecked(False)
    assert not window.serving.running and not window.settings.serve_on
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    assert not window.serving_label.isVisible()


@pytest.mark.timing
def test_turning_serving_off_returns_at_once_while_requests_run_and_it_serves_again(qtbot, make_window):
    port = free_port()
    window = make_window(quick_settings(serve_on=True, serve_port=port, n_ctx=2048))
    qtbot.waitUntil(lambda: window.serving.running, timeout=10_000)
    dialog = window.show_serve_dialog()
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        # A client that sends half its body and then nothing: a stop that waited would wait on it for seconds.
        stalled.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
        call = counting_request(qtbot, window.serving.server, max_tokens=1500)

        start = time.perf_counter()
        dialog.serve_box.setChecked(False)
        assert time.perf_counter() - start < 0.5
        assert not window.serving.running and not window.serving_label.isVisible()
    qtbot.waitUntil(lambda: "result" in call, timeout=60_000)
    status, body = call["result"]
    assert status == 503 and "turned off" in body["error"]["message"], body

    dialog.serve_box.setChecked(True)  # the same port again
    qtbot.waitUntil(lambda: window.serving.running, timeout=10_000)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        assert json.loads(response.read())["status"] == "ok"


def test_a_port_in_use_is_said_and_the_app_goes_on(qtbot, make_window):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        window = make_window(quick_settings(serve_on=True, serve_port=port))
        dialog = window.show_serve_dialog()
        assert not window.serving.running
        assert f"port {port} is in use" in dialog.state_label.text()


def test_changing_the_model_answers_the_running_request_and_serves_the_new_one(qtbot, make_window):
    port = free_port()
    window = make_window(quick_settings(serve_on=True, serve_port=port, n_ctx=2048))
    qtbot.waitUntil(lambda: window.serving.running, timeout=10_000)
    call = counting_request(qtbot, window.serving.server, max_tokens=1500)

    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model("")  # the same file again: a model change all the same
        qtbot.waitUntil(lambda: "result" in call, timeout=60_000)
    status, body = call["result"]
    assert status == 503 and "model is being changed" in body["error"]["message"]
    qtbot.waitUntil(lambda: window.serving.running, timeout=10_000)
    again = in_thread(post, f"{window.serving.base_url}/chat/completions", hello(window.serving.server.model_id))
    qtbot.waitUntil(lambda: "result" in again, timeout=120_000)
    assert again["result"][0] == 200


def test_a_reply_asked_for_during_a_programs_request_waits_its_turn_and_says_so(qtbot, make_window):
    port = free_port()
    window = make_window(quick_settings(serve_on=True, serve_port=port, n_ctx=2048))
    qtbot.waitUntil(lambda: window.serving.running, timeout=10_000)
    call = counting_request(qtbot, window.serving.server, max_tokens=400)

    window.chat_pane.input.setPlainText("Hi")
    with qtbot.waitSignal(window.replyCompleted, timeout=180_000):
        window.send_message()
        assert "Another program's request" in window.statusBar().currentMessage()
    # the program's request was answered whole (not cut short by the reply): they took turns
    qtbot.waitUntil(lambda: "result" in call, timeout=10_000)
    status, body = call["result"]
    assert status == 200 and body["usage"]["completion_tokens"] == 400, body.get("usage")
