"""The comparison tab: plain decoding on the left, lookahead on the right, one input.

The worker measures the two decoders in turns, repeated (``app.comparison_jobs``);
this view then replays each one's median run side by side, each pane on its
own clock advancing by the step times that were measured, redrawn by one
~30 Hz timer, and shows the verdict ``engine.speed.comparison.Verdict`` words: the panes'
clocks and figures and the verdict's times are the same two runs' numbers.
"""

from __future__ import annotations

from PySide6.QtCore import QElapsedTimer, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from engine import LookaheadConfig, RunStats, StepEvent
from engine.speed.comparison import LOOKAHEAD, PLAIN, CompareProgress

from ..coalescer import DEFAULT_INTERVAL_MS, UpdateCoalescer
from ..comparison_jobs import FAIRNESS_NOTE, CompareRequest, CompareResult, ReplayTrack
from ..marks import TokenMarks
from .chat_input import ChatInput
from .markdown_view import palette_is_dark
from .marked_text import MarksLegend, source_colour
from .plain import Label
from .plain import escape as plain_escape
from .plain import tip as plain_tip
from .stats_view import StepChart

DIVERGENCE_COLOUR = QColor(255, 170, 0, 150)  # amber: readable on light and dark bases
PROGRESS_STEPS = 1000  # the progress bar's range once the planned runs are known


def lookahead_title(config: LookaheadConfig) -> str:
    if config.auto:
        return "Lookahead · Auto"
    return f"Lookahead · W{config.window} N{config.ngram} G{config.guesses}"


class ComparePane(QGroupBox):
    """One decoder's reply: live text, its own clock, tokens/s, steps and the tokens-per-step chart."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(title, parent)
        self.clock = Label()
        font = QFont(self.clock.font())
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.clock.setFont(font)
        self.clock.setToolTip(
            "This decoder's own clock: its measured steps (the prompt's evaluation, the same for both, is left out)"
        )
        self.state = Label()
        self.numbers = Label()
        self.numbers.setWordWrap(True)  # two panes side by side must not widen the window
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.show_lookahead = False
        self.chart = StepChart(self)
        self.chart.setMinimumHeight(170)
        top = QHBoxLayout()
        top.addWidget(self.clock)
        top.addStretch(1)
        top.addWidget(self.state)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.numbers)
        layout.addWidget(self.text, 3)
        layout.addWidget(self.chart, 2)
        self.reset()

    def reset(self, title: str | None = None) -> None:
        if title is not None:
            self.setTitle(title)
        self.stats = RunStats()  # of the events shown so far: the run's own statistics once the replay ends
        self.marks = TokenMarks()  # how each run of the text shown came (tinted when Show lookahead is on)
        self.shown = 0  # events of the track already drawn
        self.text.clear()
        self.text.setExtraSelections([])
        self.chart.clear()
        self.clock.setText("0.00 s")
        self.state.setText("")
        self._show_numbers()

    def advance(self, events: list[StepEvent], clock_s: float) -> None:
        """Draw the events that happened since the last call, and set the clock."""
        if events:
            runs_before = len(self.marks.runs)
            grown = len(self.marks.runs[-1].text) if self.marks.runs else 0
            text = ""
            for ev in events:
                self.stats.observe(ev)
                self.marks.observe(ev)
                text += ev.text
            self.shown += len(events)
            if text:
                cursor = self.text.textCursor()
                cursor.movePosition(QTextCursor.MoveOperation.End)
                if self.show_lookahead:
                    self._insert_runs(cursor, runs_before, grown)
                else:
                    cursor.insertText(text, QTextCharFormat())
                self.text.ensureCursorVisible()
            self.chart.append([ev.n_committed for ev in events if ev.mode != "none"])
            self._show_numbers()
        self.clock.setText(f"{clock_s:.2f} s")

    def set_show_lookahead(self, on: bool) -> None:
        """Tint the text by how lookahead got each run of it (drawn again from the runs kept)."""
        if on == self.show_lookahead:
            return
        self.show_lookahead = on
        self.text.clear()
        cursor = self.text.textCursor()
        if on:
            self._insert_runs(cursor, 0, 0)
        else:
            cursor.insertText(self.marks.text(), QTextCharFormat())

    def _insert_runs(self, cursor: QTextCursor, first: int, drawn: int) -> None:
        """Insert the runs from ``first`` on, of which ``drawn`` characters of the first are shown already."""
        dark = palette_is_dark(self.palette())
        cursor.beginEditBlock()
        for k, run in enumerate(self.marks.runs[first - 1 if drawn else first :]):
            fmt = QTextCharFormat()
            colour = source_colour(run.source, dark)
            if colour is not None:
                fmt.setBackground(colour)
            cursor.insertText(run.text[drawn:] if k == 0 and drawn else run.text, fmt)
        cursor.endEditBlock()

    def _show_numbers(self) -> None:
        s = self.stats
        text = f"{s.tokens_per_s:.1f} tok/s · {s.steps} steps · {s.n_tokens} tokens · {s.tokens_per_step:.2f} tok/step"
        if s.prefill_s > 0:  # neither the clock nor the speedup counts the prompt's evaluation
            text += f" · prompt {s.prefill_s:.2f} s before the clock"
        self.numbers.setText(text)

    def highlight(self, offset: int, length: int, tip: str) -> None:
        """Mark the first divergent token (at least one character, so an empty piece still shows)."""
        doc_len = len(self.text.toPlainText())
        start = max(0, min(offset, doc_len))
        end = min(doc_len, start + max(1, length))
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setBackground(DIVERGENCE_COLOUR)
        fmt.setToolTip(plain_tip(tip))
        selection = QTextEdit.ExtraSelection()
        selection.cursor = cursor
        selection.format = fmt
        self.text.setExtraSelections([selection])
        view = QTextCursor(cursor)
        view.setPosition(start)
        self.text.setTextCursor(view)
        self.text.ensureCursorVisible()

    def highlighted_text(self) -> str:
        selections = self.text.extraSelections()
        return selections[0].cursor.selectedText() if selections else ""


class CompareView(QWidget):
    """Two panes racing on the same prompt, and the verdict once both are done.

    Signals:
        compareRequested(str): the user asked to compare this prompt (the owner builds the request).
        stopRequested(): the user pressed Stop while the runs were being measured.
        speedReportRequested(): open the speed report.
        compareCompleted(object): a ``CompareResult``, once its replay has ended and the verdict is shown.
        compareFailed(str): the comparison could not run; the message is for the user.
        busyChanged(bool): measuring started (True) or ended (False).
    """

    compareRequested = Signal(str)
    stopRequested = Signal()
    speedReportRequested = Signal()
    compareCompleted = Signal(object)
    compareFailed = Signal(str)
    busyChanged = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._request: CompareRequest | None = None  # being measured
        self._result: CompareResult | None = None  # being replayed or shown
        self._tracks: dict[str, ReplayTrack] = {}
        self._ready = False
        self.replay_speed = 1.0  # 1 = the measured pace

        self.note = Label(FAIRNESS_NOTE)
        self.note.setWordWrap(True)
        status_row = self._build_status_row()
        self.plain_pane = ComparePane("Plain decoding")
        self.lookahead_pane = ComparePane("Lookahead")
        panes = QHBoxLayout()
        panes.addWidget(self.plain_pane, 1)
        panes.addWidget(self.lookahead_pane, 1)
        self._build_verdict()
        input_row = self._build_input_row()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.note)
        layout.addLayout(status_row)
        self.legend = MarksLegend()  # what the lookahead pane's tints mean (View → Show lookahead)
        self.legend.setVisible(False)
        layout.addWidget(self.legend)
        layout.addLayout(panes, 1)
        layout.addWidget(self.verdict)
        layout.addLayout(input_row)

        self._progress_updates = UpdateCoalescer(parent=self)  # one progress repaint per ~30 Hz tick
        self._progress_updates.flushed.connect(self._on_progress_flushed)
        self._replay_timer = QTimer(self)
        self._replay_timer.setInterval(DEFAULT_INTERVAL_MS)
        self._replay_timer.timeout.connect(self._on_replay_tick)
        self._replay_clock = QElapsedTimer()
        self._skip = False
        self._update_buttons()

    def _build_status_row(self) -> QHBoxLayout:
        """What the comparison is doing, its runs' progress, and Skip replay."""
        self.status = Label("Type a prompt and press Compare.")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(200)
        self.progress.setToolTip("The planned runs of both decoders (it may end early once their times agree)")
        self.progress.setVisible(False)
        self.skip_button = QPushButton("Skip replay")
        self.skip_button.setToolTip("Show both finished replies now")
        self.skip_button.setVisible(False)
        self.skip_button.clicked.connect(self.skip_replay)
        status_row = QHBoxLayout()
        status_row.addWidget(self.status, 1)
        status_row.addWidget(self.progress)
        status_row.addWidget(self.skip_button)
        return status_row

    def _build_verdict(self) -> None:
        self.verdict = Label()
        self.verdict.setWordWrap(True)
        verdict_font = QFont(self.verdict.font())
        verdict_font.setPointSizeF(verdict_font.pointSizeF() * 1.15)
        self.verdict.setFont(verdict_font)
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

    def _build_input_row(self) -> QHBoxLayout:
        """The prompt box, with Speed report… above Compare beside it."""
        self.input = ChatInput()
        self.input.setPlaceholderText("A prompt to run through both decoders — Enter compares")
        self.input.submitted.connect(self._on_compare_clicked)
        self.compare_button = QPushButton("Compare")
        self.compare_button.setDefault(True)
        self.compare_button.clicked.connect(self._on_compare_clicked)
        self.report_button = QPushButton("Speed report…")
        self.report_button.setToolTip("Run the benchmark prompts through the same comparison")
        self.report_button.clicked.connect(self.speedReportRequested)
        buttons = QVBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.report_button)
        buttons.addWidget(self.compare_button)
        input_row = QHBoxLayout()
        input_row.addWidget(self.input, 1)
        input_row.addLayout(buttons)
        return input_row

    # --- state ---

    def set_show_lookahead(self, on: bool) -> None:
        """Tint the lookahead pane's text by how each run of it came (View → Show lookahead)."""
        self.lookahead_pane.set_show_lookahead(on)
        self.legend.setVisible(on)

    def is_measuring(self) -> bool:
        return self._request is not None

    def is_replaying(self) -> bool:
        return self._replay_timer.isActive()

    def result(self) -> CompareResult | None:
        return self._result

    def set_ready(self, ready: bool) -> None:
        """Whether a comparison can start now (a model is loaded and the engine is free)."""
        self._ready = ready
        self._update_buttons()

    def _update_buttons(self) -> None:
        measuring = self.is_measuring()
        self.compare_button.setText("Stop" if measuring else "Compare")
        self.compare_button.setToolTip("Stop measuring (Esc)" if measuring else "Run the prompt through both")
        self.compare_button.setEnabled(measuring or self._ready)
        self.report_button.setEnabled(self._ready and not measuring)

    # --- the owner's calls ---

    def begin(self, request: CompareRequest) -> None:
        """A comparison was sent to the worker: clear the panes and wait for the measurement."""
        self._stop_replay()
        self._progress_updates.clear()
        self._request = request
        self._result = None
        self.plain_pane.reset("Plain decoding")
        self.lookahead_pane.reset(lookahead_title(request.lookahead))
        first, second = ("plain", "lookahead") if request.plain_first else ("lookahead", "plain")
        settings = request.sampling.describe(request.stop.loop_guard)
        self.note.setText(f"{FAIRNESS_NOTE} This time {first} runs first, then {second}. Settings: {settings}, "
                          f"{request.stop.max_tokens} tokens at most.")
        for pane in (self.plain_pane, self.lookahead_pane):
            pane.state.setText("waiting")
        self.verdict.setText("")
        self.progress.setRange(0, 0)  # busy until the first run has shown how many runs fit
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.status.setText(f"Measuring {first} decoding, run 1…")
        self._update_buttons()
        self.busyChanged.emit(True)

    @Slot(object)
    def on_progress(self, progress: CompareProgress) -> None:
        if self._request is not None and progress.request_id == self._request.request_id:
            self._progress_updates.push(progress)

    @Slot(object)
    def on_finished(self, result: CompareResult) -> None:
        if self._request is None or result.request_id != self._request.request_id:
            return
        self._end_measuring()
        self._result = result
        self._tracks = {}
        if result.plain is not None:
            self._tracks[PLAIN] = ReplayTrack(result.plain.events)
        if result.lookahead is not None:
            self._tracks[LOOKAHEAD] = ReplayTrack(result.lookahead.events)
        if result.cancelled:
            self._skip = True  # nothing to race: show what was measured at once
            self._on_replay_tick()
            return
        self.status.setText("Replaying each decoder's median run at its measured speed…")
        for pane in (self.plain_pane, self.lookahead_pane):
            pane.state.setText("running")
        self.skip_button.setVisible(True)
        self._skip = False
        self._replay_clock.start()
        self._replay_timer.start()
        self._on_replay_tick()

    @Slot(int, str)
    def on_failed(self, request_id: int, message: str) -> None:
        if self._request is None or request_id != self._request.request_id:
            return
        self._end_measuring()
        for pane in (self.plain_pane, self.lookahead_pane):
            pane.state.setText("")
        self.status.setText("The comparison failed.")
        self.verdict.setText(f"<b>Failed:</b> {_escape(message)}")
        self.compareFailed.emit(message)

    @Slot()
    def skip_replay(self) -> None:
        if self.is_replaying():
            self._skip = True
            self._on_replay_tick()

    def shutdown(self) -> None:
        """The window is closing: stop the timers."""
        self._stop_replay()
        self._progress_updates.clear()

    # --- internals ---

    def _end_measuring(self) -> None:
        self._progress_updates.flush()
        self._request = None
        self.progress.setVisible(False)
        self._update_buttons()
        self.busyChanged.emit(False)

    def _stop_replay(self) -> None:
        self._replay_timer.stop()
        self.skip_button.setVisible(False)

    @Slot()
    def _on_compare_clicked(self) -> None:
        if self.is_measuring():
            self.stopRequested.emit()
            return
        text = self.input.toPlainText().strip()
        if text and self._ready:
            self.compareRequested.emit(text)

    @Slot(list)
    def _on_progress_flushed(self, updates: list[CompareProgress]) -> None:
        if self._request is None or not updates:
            return
        last = updates[-1]
        fraction = last.fraction
        if fraction is not None:
            if self.progress.maximum() != PROGRESS_STEPS:
                self.progress.setRange(0, PROGRESS_STEPS)
            self.progress.setValue(max(self.progress.value(), round(fraction * PROGRESS_STEPS)))
        of = f" of up to {last.planned_runs}" if last.planned_runs else ""
        self.status.setText(f"Measuring {last.phase} decoding, run {last.run + 1}{of}… {last.n_tokens} tokens")

    @Slot()
    def _on_replay_tick(self) -> None:
        result = self._result
        if result is None:
            self._stop_replay()
            return
        t = float("inf") if self._skip else self._replay_clock.elapsed() / 1000.0 * self.replay_speed
        all_done = True
        for phase, pane in ((PLAIN, self.plain_pane), (LOOKAHEAD, self.lookahead_pane)):
            track = self._tracks.get(phase)
            if track is None:
                continue
            n = track.done_by(t)
            pane.advance(track.events[pane.shown : n], track.clock(t))
            if n >= len(track.events):
                pane.state.setText("done")
            else:
                all_done = False
        self._align_charts()
        if all_done:
            self._stop_replay()
            self._show_verdict(result)

    def _align_charts(self) -> None:
        """One scale for both charts, so fewer, taller lookahead steps read at a glance."""
        charts = (self.plain_pane.chart, self.lookahead_pane.chart)
        x = max(c.axis_x.max() for c in charts)
        y = int(max(c.axis_y.max() for c in charts))
        if y > 6:
            y = -(-y // 4) * 4  # five whole-number ticks: 0, y/4, …, y
        for c in charts:
            c.axis_x.setRange(0, x)
            c.axis_y.setRange(0, y)
            c.axis_y.setTickCount(y + 1 if y <= 6 else 5)

    def _show_verdict(self, result: CompareResult) -> None:
        if not result.complete:
            self.status.setText("Stopped before one A-B-B-A block of runs finished: no comparison.")
            self.verdict.setText("<b>Stopped.</b> Press Compare to run the prompt again.")
            for pane in (self.plain_pane, self.lookahead_pane):
                pane.state.setText("stopped" if pane.shown else "")
            self.compareCompleted.emit(result)
            return
        verdict = result.verdict
        assert verdict is not None
        pairs = verdict.measured.n
        self.status.setText(f"Done: {pairs} pair{'s' if pairs != 1 else ''} of runs.")
        speed = f"<b>{verdict.headline}</b> ({_escape(verdict.explanation)}) · {_escape(verdict.times)}"
        if verdict.notice:
            speed = f"<b>{_escape(verdict.notice)}</b><br>{speed}"
        if result.plain is not None and result.plain.stats.stop_reason == "loop":
            speed += " · <b>the reply repeated itself and was stopped</b>: a loop's drafts land easily, so this " \
                     "figure flatters lookahead"
        div = result.divergence
        if result.identical:
            same = "Texts identical: <b>yes</b>"
        elif div is None:
            same = "Texts identical: <b>no</b>"
        else:
            gap = f"{div.plain_top2_gap:.3f}" if div.plain_top2_gap is not None else "n/a"
            same = (
                f"Texts identical: <b>no</b>, first different token #{div.index}: plain "
                f"“{_escape(div.plain_piece)}” vs lookahead “{_escape(div.lookahead_piece)}” "
                f"(plain top-2 logit gap {gap}; a small gap is a near tie)"
            )
            tip = f"first divergent token #{div.index}, plain top-2 logit gap {gap}"
            self.plain_pane.highlight(div.plain_offset, len(div.plain_piece), tip)
            self.lookahead_pane.highlight(div.lookahead_offset, len(div.lookahead_piece), tip)
        self.verdict.setText(f"{speed} · {same}")
        self.compareCompleted.emit(result)


def _escape(text: str) -> str:
    return plain_escape(text, newline="⏎")
