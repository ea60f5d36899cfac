"""The app as a new user meets it: the first reply on a fresh PC, and damaged model files opened mid-session."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QMessageBox

from engine import ModelFileError, check_gguf
from engine.llama.probe import ProbeResult, ensure_loadable
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, quick_settings
from tests.helpers.damage import bad_model_files, make_damage, u64_fields, write_damaged_copy

pytestmark = pytest.mark.model


@pytest.mark.auto
@pytest.mark.timing
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
    # Idle again: the measurement resumes and ends; its result stays readable in the status bar.
    qtbot.waitUntil(lambda: window.measure_status.state == "done", timeout=120_000)
    status = window.measure_status
    assert status.face == "result" and status.isVisible()
    assert status.label.text().startswith("Measured this PC for lookahead in ")
    assert ": batches of 4 tokens cost " in status.label.text() and status.label.toolTip()


def test_loading_a_model_reads_its_header_once(make_window, monkeypatch):
    import engine.llama.models as models

    real_read = models._read_header
    reads: list[Path] = []

    def counting_read(path: Path, size: int):
        reads.append(path)
        return real_read(path, size)

    monkeypatch.setattr(models, "_read_header", counting_read)
    window = make_window(quick_settings())
    # The first-open check's header reading is handed on to the engine, not repeated by it.
    assert reads == [Path(window.model.path)]


def _failed_load(qtbot, window, path: Path) -> QMessageBox:
    """Load ``path`` in ``window``, which must fail; the message box it opened."""
    window.models.error_box = None
    with qtbot.waitSignal(window.modelLoadFailed, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(str(path))
    box = window.models.error_box
    assert box is not None and box.isVisible()
    return box


def test_each_kind_of_bad_file_opened_in_the_app_is_told_in_plain_words_with_details_one_click_away(
    qtbot, make_window, model_path, tmp_path
):
    files = bad_model_files(model_path, tmp_path / "bad")
    window = make_window(quick_settings())
    model_before = window.model
    for name, sentence in (
        ("not gguf", "This file is not a GGUF model."),
        ("cut in its weights", "This file is cut short: it holds 5 MB of the 98 MB the model needs."),
        ("newer version", "This model file uses a newer GGUF version (4) than this app can read."),
        ("missing", "This model file is not there any more"),
    ):
        box = _failed_load(qtbot, window, files[name])
        assert box.text().startswith(sentence), (name, box.text())
        assert box.windowTitle() == f"Could not open {files[name].name}"
        assert box.detailedText() == str(_check_error(files[name]))  # the technical line, behind "Show Details…"
        details = [b for b in box.buttons() if box.buttonRole(b) == QMessageBox.ButtonRole.ActionRole]
        assert len(details) == 1  # Qt's "Show Details…" button
        box.close()
        assert window.model == model_before  # the model in use stays
    assert window.model_label.text().startswith(model_before.display_name)


def _check_error(path: Path) -> ModelFileError:
    try:
        check_gguf(path)
    except ModelFileError as exc:
        return exc
    raise AssertionError(f"{path} passed the header check")


def test_the_first_open_check_is_announced_in_plain_words(qtbot, make_window, tmp_path):
    window = make_window(quick_settings())
    said: list[str] = []
    window.statusBar().messageChanged.connect(said.append)
    copy = tmp_path / "my-model.gguf"
    copy.write_bytes(Path(window.model.path).read_bytes())  # a file never opened before: checked first
    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(str(copy))
    checking = [text for text in said if text.startswith("Loading") and "check" in text]
    assert checking == [
        "Loading my-model.gguf… first a quick check that the file is complete (only the first time it is opened)"
    ]
    assert not any("crash" in text or "damaged" in text for text in said)


def _crashing_probe(path: str | os.PathLike[str], **kwargs: Any) -> ProbeResult:
    """The real first-open check, with a child that dies the way llama.cpp's GGML_ASSERT kills a process."""
    command = [sys.executable, "-c", "import os, sys; sys.stderr.write('GGML_ASSERT(x) failed\\n'); os.abort()"]
    return ensure_loadable(path, command=command, **kwargs)


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
        box = _failed_load(qtbot, window, copy)
        assert box.icon() == QMessageBox.Icon.Critical and copy.name in box.windowTitle()
        assert "\n" not in box.text().strip() and str(copy) not in box.text(), box.text()  # plain words
        assert "\n" not in box.detailedText() and box.detailedText().endswith(str(copy))  # the technical line
        box.close()
        assert window.model == model_before

    # A file the header check lets through but whose test load dies by a signal: the app lives on.
    crash_next.append(True)
    unknown = tmp_path / "unknown.gguf"
    unknown.write_bytes(model_path.read_bytes())
    box = _failed_load(qtbot, window, unknown)
    assert box.text().startswith("llama.cpp stopped while loading this file, so the file is most likely damaged")
    assert "SIGABRT" in box.detailedText() and "GGML_ASSERT(x) failed" in box.detailedText()
    box.close()
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
