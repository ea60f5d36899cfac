"""``--self-test``: drive the real window like a user would, and report."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Slot
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from .main_window import MainWindow, ReplyRecord

SETTLE_MS = 400  # let the last repaint land before the screenshot


class SelfTest(QObject):
    """Waits for the model, types ``prompt``, presses Send, waits for the reply, then exits."""

    def __init__(
        self, window: MainWindow, prompt: str, screenshot: Path | None, timeout_s: float, max_tokens: int
    ) -> None:
        super().__init__(window)
        self.window = window
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.screenshot = screenshot
        self.timeout_s = timeout_s
        self.code = 1
        self._record: ReplyRecord | None = None
        window.modelChanged.connect(self._on_model_changed)
        window.modelLoadFailed.connect(self._on_failed)
        window.replyRejected.connect(self._on_failed)
        window.replyCompleted.connect(self._on_reply_completed)

    def run(self, app: QApplication) -> int:
        spin = self.window.panel.max_tokens_spin
        saved = spin.value()
        spin.setValue(self.max_tokens)  # a bounded reply keeps the test's time bounded
        QTimer.singleShot(int(self.timeout_s * 1000), self._on_timeout)
        app.exec()
        spin.setValue(saved)  # the user's own setting, if LOOKAHEAD_CHAT_HOME pointed at real data
        self.window.close()
        return self.code

    @Slot(object)
    def _on_model_changed(self, _model: object) -> None:
        if self.window.is_generating() or self._record is not None:
            return
        self.window.input.setFocus()
        QTest.keyClicks(self.window.input, self.prompt)
        self.window.send_button.click()

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        print(f"self-test FAILED: {message}", file=sys.stderr)
        self._finish(2)

    @Slot(object)
    def _on_reply_completed(self, record: ReplyRecord) -> None:
        self._record = record
        QTimer.singleShot(SETTLE_MS, self._on_settled)

    @Slot()
    def _on_settled(self) -> None:
        record = self._record
        assert record is not None
        if self.screenshot is not None:
            self.screenshot.parent.mkdir(parents=True, exist_ok=True)
            if not self.window.grab().save(str(self.screenshot)):
                print(f"self-test FAILED: could not save {self.screenshot}", file=sys.stderr)
                self._finish(5)
                return
            print(f"screenshot: {self.screenshot}")
        print(f"prompt: {self.prompt}")
        print(f"reply:\n{record.text}")
        print(f"stats: {record.stats.summary_line()}")
        print(f"tokens per step: {record.stats.per_step}")
        ok = bool(record.text.strip()) and record.stats.n_tokens > 0 and record.outcome.error is None
        if not ok:
            print("self-test FAILED: empty reply or error", file=sys.stderr)
        self._finish(0 if ok else 3)

    @Slot()
    def _on_timeout(self) -> None:
        print(f"self-test FAILED: no reply within {self.timeout_s:.0f} s", file=sys.stderr)
        self._finish(4)

    def _finish(self, code: int) -> None:
        self.code = code
        QApplication.instance().exit(code)
