"""In the window: a file attached to the message being written is read before Send (bundled model)."""

from __future__ import annotations

import pytest

from engine.decoding.prompt_cache import PREFILL_CHUNK
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, REPLY_TIMEOUT_MS, quick_settings

pytestmark = [pytest.mark.model, OFFSCREEN_NOISE]

MANUAL = "\n".join(
    f"Section {k}. The pump checks its pressure every {k + 2} minutes and logs a warning when it drops below "
    f"{k * 3 + 10} kPa. Operators reset the counter with the command reset-{k}."
    for k in range(1, 40)
)


def test_a_file_attached_while_writing_is_read_before_send_which_reads_little_more_than_the_question(
    qtbot, make_window, tmp_path
):
    window = make_window(quick_settings(threads=2, n_ctx=4096, max_tokens=8, lookahead_on=False))
    path = tmp_path / "manual.txt"
    path.write_text(MANUAL, encoding="utf-8")
    reads: list[int] = []  # appended to on the engine's thread
    window.engine.worker.readAheadDone.connect(reads.append)
    window.chat_pane.attach_files([str(path)])
    qtbot.waitUntil(lambda: sum(reads) > 10 * PREFILL_CHUNK, timeout=REPLY_TIMEOUT_MS)  # read while the user writes
    question = "Which command resets the counter of section 7?"
    window.input.setPlainText(question)
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        window.send_button.click()
    stats = blocker.args[0].stats
    assert stats.prompt_cached_tokens > 10 * PREFILL_CHUNK
    assert stats.prefill_tokens < PREFILL_CHUNK + 40  # the last partial chunk, the question and the markers
    # The next message begins with this exchange: it is read ahead too (the reply's turn is mostly cached).
    done = len(reads)
    qtbot.waitUntil(lambda: len(reads) > done, timeout=REPLY_TIMEOUT_MS)
