"""Live statistics of the running reply: a QtCharts plot of tokens per step, and the totals."""

from __future__ import annotations

from PySide6.QtCharts import QAreaSeries, QChart, QChartView, QLineSeries, QValueAxis
from PySide6.QtCore import QMargins, QPointF, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import QFormLayout, QLabel, QVBoxLayout, QWidget

from engine import RunStats, StepEvent

MIN_X_RANGE = 20  # steps shown before the axis starts to grow


class StepChart(QChartView):
    """Tokens committed by each forward pass, drawn as bars, with the running mean.

    One area series shaped as steps (two points per forward pass) rather than a
    bar series: a single item redraws fast however long the reply gets.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        chart = QChart()
        super().__init__(chart, parent)
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setMinimumHeight(230)
        chart.legend().setVisible(True)
        chart.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)
        chart.setMargins(QMargins(2, 2, 2, 2))
        chart.layout().setContentsMargins(0, 0, 0, 0)
        chart.setBackgroundRoundness(0)

        self._upper = QLineSeries()
        self.bars = QAreaSeries(self._upper)
        self.bars.setName("tokens per step")
        self.mean = QLineSeries()
        self.mean.setName("mean")
        chart.addSeries(self.bars)
        chart.addSeries(self.mean)

        self.axis_x = QValueAxis()
        self.axis_x.setLabelFormat("%d")
        self.axis_x.setTitleText("step")
        self.axis_y = QValueAxis()
        self.axis_y.setLabelFormat("%d")
        chart.addAxis(self.axis_x, Qt.AlignmentFlag.AlignBottom)
        chart.addAxis(self.axis_y, Qt.AlignmentFlag.AlignLeft)
        for series in (self.bars, self.mean):
            series.attachAxis(self.axis_x)
            series.attachAxis(self.axis_y)
        self._values: list[int] = []
        self._total = 0
        self.apply_palette(self.palette())
        self.clear()

    def apply_palette(self, palette: QPalette) -> None:
        """Colours from the system palette, so light and dark themes both read well."""
        chart = self.chart()
        text = palette.color(QPalette.ColorRole.WindowText)
        grid = palette.color(QPalette.ColorRole.Mid)
        accent = palette.color(QPalette.ColorRole.Highlight)
        chart.setBackgroundBrush(palette.color(QPalette.ColorRole.Base))
        chart.setPlotAreaBackgroundVisible(False)
        chart.legend().setLabelColor(text)
        for axis in (self.axis_x, self.axis_y):
            axis.setLabelsColor(text)
            axis.setTitleBrush(text)
            axis.setGridLineColor(grid)
            axis.setLinePenColor(grid)
        fill = QColor(accent)
        fill.setAlpha(150)
        self.bars.setBrush(fill)
        self.bars.setPen(QPen(accent, 1))
        mean_pen = QPen(text, 1.5, Qt.PenStyle.DashLine)
        self.mean.setPen(mean_pen)

    def clear(self) -> None:
        self._values = []
        self._total = 0
        self._upper.clear()
        self.mean.clear()
        self.axis_x.setRange(0, MIN_X_RANGE)
        self.axis_y.setRange(0, 4)
        self.axis_y.setTickCount(5)

    def values(self) -> list[int]:
        return list(self._values)

    def append(self, committed: list[int]) -> None:
        """Add the tokens committed by the next steps (one call per repaint, not per step)."""
        if not committed:
            return
        bars, means = [], []
        for value in committed:
            i = len(self._values)
            self._values.append(value)
            self._total += value
            bars += [QPointF(i, value), QPointF(i + 1, value)]
            means.append(QPointF(i + 0.5, self._total / len(self._values)))
        self._upper.append(bars)
        self.mean.append(means)
        self.axis_x.setRange(0, max(MIN_X_RANGE, len(self._values)))
        self.axis_y.setRange(0, max(4, max(self._values) + 1))
        top = int(self.axis_y.max())
        self.axis_y.setTickCount(top + 1 if top <= 6 else 5)


def prompt_text(stats: RunStats) -> str:
    """The prompt's processing, e.g. ``412 tokens, 380 cached · 850 tok/s``."""
    text = f"{stats.prompt_tokens} tokens, {stats.prompt_cached_tokens} cached"
    if stats.prompt_tokens_per_s > 0:
        text += f" · {stats.prompt_tokens_per_s:.0f} tok/s"
    return text


def threads_text(event: StepEvent) -> str:
    """The threads a step ran with, e.g. ``2`` or ``1 of 2 (another program is busy)``."""
    if event.threads < event.max_threads:
        return f"{event.threads} of {event.max_threads} (another program is busy)"
    return f"{event.threads}"


class LiveStatsView(QWidget):
    """The chart plus live tokens/s, mean tokens per step, acceptance and time to first token."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chart = StepChart(self)
        self.tokens_per_s = QLabel()
        self.tokens_per_step = QLabel()
        self.acceptance = QLabel()
        self.first_token = QLabel()
        self.tokens = QLabel()
        self.prompt = QLabel()
        self.prompt.setToolTip(
            "The prompt's tokens, how many were reused from the cache (the chat so far, kept between turns), "
            "and how fast the rest were read"
        )
        self.shape = QLabel()
        self.shape.setWordWrap(True)
        self.threads = QLabel()
        self.threads.setToolTip(
            "CPU threads the last step ran with. When another program keeps a core busy, the engine gives that\n"
            "core up (a thread that shares a core slows every step) and tries it again a few seconds later."
        )
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.setHorizontalSpacing(12)
        form.setVerticalSpacing(2)
        form.addRow("Tokens/s", self.tokens_per_s)
        form.addRow("Mean tokens/step", self.tokens_per_step)
        form.addRow("Acceptance", self.acceptance)
        form.addRow("Time to first token", self.first_token)
        form.addRow("Prompt", self.prompt)
        form.addRow("Tokens / steps", self.tokens)
        form.addRow("Step shape", self.shape)
        form.addRow("Threads", self.threads)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.chart, 1)
        layout.addLayout(form)
        self.reset()

    def reset(self) -> None:
        self.chart.clear()
        for label in (self.tokens_per_s, self.tokens_per_step, self.acceptance, self.first_token, self.tokens,
                      self.prompt, self.threads):
            label.setText("–")
        self.shape.setText("–")

    def show_progress(self, stats: RunStats, new_steps: list[int], last: StepEvent | None) -> None:
        """Update after a batch of steps (called at most ~30 times a second)."""
        self.chart.append(new_steps)
        self.tokens_per_s.setText(f"{stats.tokens_per_s:.1f}")
        self.tokens_per_step.setText(f"{stats.tokens_per_step:.2f}")
        acc = stats.acceptance
        self.acceptance.setText(f"{acc:.0%}  ({stats.n_accepted}/{stats.n_drafted})" if acc is not None else "–")
        self.first_token.setText(f"{stats.first_token_s:.2f} s" if stats.first_token_s is not None else "–")
        self.tokens.setText(f"{stats.n_tokens} / {stats.steps}")
        if stats.prompt_tokens:
            self.prompt.setText(prompt_text(stats))
        if last is not None and last.threads:
            self.threads.setText(threads_text(last))
        if last is not None and last.mode == "lookahead":
            self.shape.setText(f"lookahead  W{last.window} N{last.ngram} G{last.guesses}  (batch {last.batch_size})")
        elif last is not None and last.mode == "auto":
            what = f"{last.n_drafted}-token draft" if last.n_drafted else "plain step"
            if last.window:
                what += f" + window {last.window}"
            self.shape.setText(f"auto  {what}  (batch {last.batch_size})")
            self.shape.setToolTip(last.choice)
        elif last is not None and last.mode == "plain":
            self.shape.setText(f"plain  (batch {last.batch_size})")
