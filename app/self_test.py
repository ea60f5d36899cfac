"""``--self-test`` (and ``--self-test --compare``): drive the real window like a user would, and report."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Slot
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QWidget

from .comparison_jobs import CompareResult
from .main_window import MainWindow, ReplyRecord

SETTLE_MS = 400  # let the last repaint land before the screenshot


def type_text(widget: QWidget, text: str) -> None:
    """Type ``text`` like a user: QTest cannot type a newline, so lines are joined with Shift+Enter."""
    for i, line in enumerate(text.split("\n")):
        if i:
            QTest.keyClick(widget, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
        QTest.keyClicks(widget, line)


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
        type_text(self.window.input, self.prompt)
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
        if self.screenshot is not None and not self._save_screenshot():
            return
        print(f"prompt: {self.prompt}")
        print(f"reply:\n{record.text}")
        print(f"stats: {record.stats.summary_line()}")
        print(f"tokens per step: {record.stats.per_step}")
        ok = bool(record.text.strip()) and record.stats.n_tokens > 0 and record.outcome.error is None
        if not ok:
            print("self-test FAILED: empty reply or error", file=sys.stderr)
        self._finish(0 if ok else 3)

    def _save_screenshot(self) -> bool:
        assert self.screenshot is not None
        self.screenshot.parent.mkdir(parents=True, exist_ok=True)
        if not self.window.grab().save(str(self.screenshot)):
            print(f"self-test FAILED: could not save {self.screenshot}", file=sys.stderr)
            self._finish(5)
            return False
        print(f"screenshot: {self.screenshot}")
        return True

    @Slot()
    def _on_timeout(self) -> None:
        print(f"self-test FAILED: no reply within {self.timeout_s:.0f} s", file=sys.stderr)
        self._finish(4)

    def _finish(self, code: int) -> None:
        self.code = code
        QApplication.exit(code)


class CompareSelfTest(SelfTest):
    """Waits for the model, opens the comparison tab, types ``prompt``, presses Compare, waits for the verdict."""

    def __init__(
        self, window: MainWindow, prompt: str, screenshot: Path | None, timeout_s: float, max_tokens: int
    ) -> None:
        super().__init__(window, prompt, screenshot, timeout_s, max_tokens)
        window.replyCompleted.disconnect(self._on_reply_completed)
        window.compare_view.compareCompleted.connect(self._on_compare_completed)
        window.compare_view.compareFailed.connect(self._on_failed)
        self._result: CompareResult | None = None

    @Slot(object)
    def _on_model_changed(self, _model: object) -> None:
        if self.window.is_busy() or self._result is not None:
            return
        self.window.show_compare_tab()
        view = self.window.compare_view
        type_text(view.input, self.prompt)
        view.compare_button.click()

    @Slot(object)
    def _on_compare_completed(self, result: CompareResult) -> None:
        self._result = result
        QTimer.singleShot(SETTLE_MS, self._on_compare_settled)

    @Slot()
    def _on_compare_settled(self) -> None:
        result = self._result
        assert result is not None
        if self.screenshot is not None and not self._save_screenshot():
            return
        print(f"prompt: {self.prompt}")
        for name, run in (("plain", result.plain), ("lookahead", result.lookahead)):
            if run is not None:
                s = run.stats
                print(
                    f"{name}: {s.n_tokens} tokens, {s.steps} steps, {s.decode_s:.3f} s, "
                    f"{s.tokens_per_s:.1f} tok/s, {s.tokens_per_step:.2f} tok/step"
                )
                print(f"{name} text:\n{s.text}")
        print(f"order: {'plain' if result.plain_first else 'lookahead'} first")
        print(f"speedup: {result.speedup:.3f}x  identical: {'yes' if result.identical else 'no'}")
        if result.divergence is not None:
            d = result.divergence
            print(f"first divergence: token #{d.index} plain {d.plain_piece!r} vs lookahead {d.lookahead_piece!r}, "
                  f"plain top-2 gap {d.plain_top2_gap}")
        print(f"verdict: {self.window.compare_view.verdict.text()}")
        view = self.window.compare_view
        plain, lookahead = result.plain, result.lookahead
        ok = (
            result.complete
            and plain is not None
            and lookahead is not None
            and result.speedup > 0
            and bool(plain.stats.text.strip())
            and view.plain_pane.text.toPlainText() == plain.stats.text
            and view.lookahead_pane.text.toPlainText() == lookahead.stats.text
        )
        if not ok:
            print("self-test FAILED: incomplete comparison or panes not filled", file=sys.stderr)
        self._finish(0 if ok else 3)
