"""The app as a new user meets it: the first reply on a fresh PC, and damaged model files opened mid-session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine import ModelFileError, check_gguf
from engine.probe import ensure_loadable
from tests.app_fixtures import MODEL_LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, quick_settings
from tests.damage import make_damage, u64_fields, write_damaged_copy

pytestmark = pytest.mark.model


@pytest.mark.auto
def test_a_first_reply_on_a_fresh_pc_shows_the_message_at_once_and_the_measurement_pauses_for_it(
    qtbot, make_window
):
    window = make_window(quick_settings(max_tokens=8, auto=True))
    # A fresh data folder: no cost curve yet, so the PC is being measured (visibly, with Skip).
    qtbot.waitUntil(lambda: window.measure_status.isVisible(), timeout=MODEL_LOAD_TIMEOUT_MS)
    assert window.measure_status.is_running()

    window.input.setPlainText("List the days of the week.")
    started = []
    window.engine.worker.replyStarted.connect(lambda _id: started.append(len(window.chat_view.bubbles())))
    window.send_button.click()
    # Before the worker has even answered: the message is in the chat, the box is empty, a reply is coming.
    assert [b.role for b in window.chat_view.bubbles()] == ["user", "assistant"]
    assert window.chat_view.bubbles()[0].text().strip() == "List the days of the week."
    assert window.input.toPlainText() == ""
    assert not window.measure_status.isVisible() and window.measure_status.state == "paused"

    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        pass
    record = blocker.args[0]
    assert record.text.strip()
    # TTFT is the wait from Send to the first token, not the engine's own share of it.
    assert 0 < record.stats.first_token_s < 30
    # Idle again: the measurement resumes and ends, and is not shown again.
    qtbot.waitUntil(lambda: window.measure_status.state == "done", timeout=120_000)
    assert not window.measure_status.isVisible()


def test_loading_a_model_reads_its_header_once(make_window, monkeypatch):
    import engine.models as models

    real_read = models._read_header
    reads: list[Path] = []

    def counting_read(path: Path, size: int):
        reads.append(path)
        return real_read(path, size)

    monkeypatch.setattr(models, "_read_header", counting_read)
    window = make_window(quick_settings())
    # The first-open check's header reading is handed on to the engine, not repeated by it.
    assert reads == [Path(window.model.path)]


def _crashing_probe(*args, **kwargs):
    """The real first-open check, with a child that dies the way llama.cpp's GGML_ASSERT kills a process."""
    command = [sys.executable, "-c", "import os, sys; sys.stderr.write('GGML_ASSERT(x) failed\\n'); os.abort()"]
    return ensure_loadable(*args, command=command, **kwargs)


def _refused_copies(model_path: Path, tmp_path: Path, wanted: int) -> list[Path]:
    """Seeded damaged copies of the bundled model that the header check refuses."""
    original = model_path.read_bytes()[: 2 * 1024 * 1024]
    fields = u64_fields(original)
    size = model_path.stat().st_size
    out = []
    for index in range(200):
        copy = write_damaged_copy(model_path, tmp_path / f"damaged-{index}.gguf",
                                  make_damage(index, 7, original, fields, size))
        try:
            check_gguf(copy)
        except ModelFileError:
            out.append(copy)
            if len(out) == wanted:
                return out
        else:
            copy.unlink()
    raise AssertionError(f"only {len(out)} of 200 seeded copies were refused")


def test_damaged_model_files_opened_mid_session_lose_no_chat_typed_text_or_setting(
    qtbot, make_window, dialogs, model_path, tmp_path, worker_options
):
    crash_next: list[bool] = []
    real_check = worker_options["check_loadable"]

    def check_loadable(*args, **kwargs):
        return (_crashing_probe if crash_next else real_check)(*args, **kwargs)

    worker_options["check_loadable"] = check_loadable
    window = make_window(quick_settings(max_tokens=8))
    window.input.setPlainText("Say hi.")
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        window.send_button.click()
    chat_id = blocker.args[0].conversation_id
    before = window.store.messages(chat_id)
    model_before = window.model
    window.panel.max_tokens_spin.setValue(12)
    window.input.setPlainText("typed, not sent yet")

    for copy in _refused_copies(model_path, tmp_path, wanted=4):
        dialogs.shown.clear()
        with qtbot.waitSignal(window.modelLoadFailed, timeout=MODEL_LOAD_TIMEOUT_MS):
            window.load_model(str(copy))
        assert [kind for kind, _t, _x in dialogs.shown] == ["critical"], copy
        assert "\n" not in dialogs.shown[0][2].strip() and copy.name in dialogs.shown[0][2], dialogs.shown[0][2]
        assert window.model == model_before

    # A file the header check lets through but whose test load dies by a signal: the app lives on.
    crash_next.append(True)
    dialogs.shown.clear()
    unknown = tmp_path / "unknown.gguf"
    unknown.write_bytes(model_path.read_bytes())
    with qtbot.waitSignal(window.modelLoadFailed, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(str(unknown))
    assert "SIGABRT" in dialogs.shown[0][2] and "GGML_ASSERT(x) failed" in dialogs.shown[0][2]
    assert window.model == model_before

    assert window.input.toPlainText() == "typed, not sent yet"
    assert window.store.messages(chat_id) == before
    assert window.current_conversation_id() == chat_id
    assert window.panel.max_tokens_spin.value() == 12 and window.settings.model_path == ""
    window.input.setPlainText("Say hello again.")
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        window.send_button.click()
    assert blocker.args[0].text.strip()
    assert blocker.args[0].stats.model == model_before.display_name
