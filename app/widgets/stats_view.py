"""Live statistics of the running reply: a QtCharts plot of tokens per step, and the totals."""

from __future__ import annotations

import math

from PySide6.QtCharts import QAreaSeries, QChart, QChartView, QLineSeries, QValueAxis
from PySide6.QtCore import QMargins, QPointF, Qt, Slot
from PySide6.QtGui import QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import QFormLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from engine import RunStats, StepEvent

from ..stats import ReplyStats
from .plain import Label
from .plain import tip as plain_tip

MIN_X_RANGE = 20  # steps shown before the axis starts to grow
MIN_Y_TOP = 4  # tokens per step shown before the axis starts to grow
TICKS = 5  # at most this many intervals on an axis

CHART_TIP = (
    "Each bar is one forward pass of the model: the tokens it added to the reply. A plain step adds 1; a\n"
    "lookahead step adds 1 plus the draft tokens the model confirmed. The dashed line is the running mean\n"
    "(Tokens per step below)."
)


def nice_interval(span: float, ticks: int = TICKS) -> int:
    """A round tick interval (1, 2 or 5 times a power of ten, at least 1): at most ``ticks`` intervals on ``span``.

    For example 164 steps get ticks every 50 (0, 50, 100, 150) rather than 0, 41, 82, 123, 164.
    """
    raw = span / ticks
    if raw <= 1:
        return 1
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * magnitude >= raw:
            return int(factor * magnitude)
    return int(10 * magnitude)  # not reached: 10 × magnitude > raw


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
        self.setToolTip(CHART_TIP)
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
        for axis in (self.axis_x, self.axis_y):
            # Ticks at round numbers from 0 (0, 50, 100…), not the range cut into equal parts (0, 41, 82…),
            # whoever sets the range (the Compare tab lines two charts up).
            axis.setTickType(QValueAxis.TickType.TicksDynamic)
            axis.setTickAnchor(0)
            axis.rangeChanged.connect(self._retick)
        chart.plotAreaChanged.connect(self._retick)  # the room for the tokens' labels changed
        chart.addAxis(self.axis_x, Qt.AlignmentFlag.AlignBottom)
        chart.addAxis(self.axis_y, Qt.AlignmentFlag.AlignLeft)
        for series in (self.bars, self.mean):
            series.attachAxis(self.axis_x)
            series.attachAxis(self.axis_y)
        self._values: list[int] = []
        self._total = 0
        # Every point drawn, kept here: a flush hands each series its whole list at once (``replace``), where
        # ``append`` redraws the series once per point, which grows with the series (a long reply's chart took
        # a visible pause: docs/SPEED.md, "The figures behind the code's constants").
        self._bar_points: list[QPointF] = []
        self._mean_points: list[QPointF] = []
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
        """No steps: empty axes of the smallest size."""
        self._values = []
        self._total = 0
        self._bar_points = [QPointF(0, 0)]  # emptied outright, the area would still draw an edge at x = 0
        self._mean_points = []
        self._upper.replace(self._bar_points)
        self.mean.replace(self._mean_points)
        self._fit_axes()

    def values(self) -> list[int]:
        """The tokens each step drawn so far committed."""
        return list(self._values)

    def append(self, committed: list[int]) -> None:
        """Add the tokens committed by the next steps (one call per repaint, not per step)."""
        if not committed:
            return
        for value in committed:
            i = len(self._values)
            self._values.append(value)
            self._total += value
            self._bar_points += [QPointF(i, value), QPointF(i + 1, value)]
            self._mean_points.append(QPointF(i + 0.5, self._total / len(self._values)))
        self._upper.replace(self._bar_points)
        self.mean.replace(self._mean_points)
        self._fit_axes()

    def _fit_axes(self) -> None:
        steps = max(MIN_X_RANGE, len(self._values))
        top = max(MIN_Y_TOP, max(self._values, default=0) + 1)
        self.axis_x.setRange(0, steps)
        self.axis_y.setRange(0, top)

    @Slot()
    def _retick(self) -> None:
        self.axis_x.setTickInterval(nice_interval(self.axis_x.max() - self.axis_x.min()))
        span = self.axis_y.max() - self.axis_y.min()
        # Every whole token while their labels fit the plot's height, two text lines apart (QtCharts shows labels
        # that do not fit as "…"); fewer, at round numbers, where they would not.
        height = self.chart().plotArea().height() or 0.6 * self.height()
        room = max(int(height / (2 * self.fontMetrics().height())), 1)
        self.axis_y.setTickInterval(1 if span <= room else nice_interval(span, min(room, TICKS)))


def prompt_text(stats: RunStats) -> str:
    """The prompt's processing, e.g. ``412 tokens, 380 cached · 850 tok/s``."""
    text = f"{stats.prompt_tokens} tokens, {stats.prompt_cached_tokens} cached"
    if stats.prompt_tokens_per_s > 0:
        text += f" · {stats.prompt_tokens_per_s:.0f} tok/s"
    return text


def threads_text(event: StepEvent) -> str:
    """The threads a step ran with, e.g. ``2`` or ``1 of 2 (another program is busy)``; a step on trial says so."""
    if event.threads == event.kept_threads or not event.kept_threads:
        if event.threads < event.max_threads:
            return f"{event.threads} of {event.max_threads} (another program is busy)"
        return f"{event.threads}"
    if event.threads < event.kept_threads:
        return f"{event.threads} of {event.max_threads} (trying fewer: the cores are busy)"
    return f"{event.threads} of {event.max_threads} (trying more: a core may be free)"


def tokens_per_step_text(stats: ReplyStats) -> str:
    """The mean tokens per step, with how many steps drafted at all, e.g. ``1.09 (9 of 172 steps drafted)``."""
    text = f"{stats.tokens_per_step:.2f}"
    if stats.steps and not stats.n_drafted:
        text += "  (no step drafted)"
    elif stats.drafting_steps:  # counted live only: a stored reply does not keep it
        text += f"  ({stats.drafting_steps} of {stats.steps} steps drafted)"
    return text


def acceptance_text(stats: RunStats) -> str:
    """The draft tokens the model confirmed, e.g. ``15 of 15 tokens offered (100%)``; "–" when nothing was drafted."""
    if not stats.n_drafted:
        return "–"
    return f"{stats.n_accepted} of {stats.n_drafted} tokens offered ({stats.n_accepted / stats.n_drafted:.0%})"


def speedup_text(stats: RunStats) -> str:
    """The steps' predicted speed against plain decoding, e.g. ``≈ 1.4× vs plain``; a dash when no step was priced
    or the reply was stopped for repeating itself (drafts land in a loop: that is no speed of text worth keeping)."""
    if stats.stop_reason == "loop":
        return "vs plain: – (it was repeating itself)"
    estimate = stats.predicted_speedup
    return f"≈ {estimate:.1f}× vs plain" if estimate > 0 else "vs plain: –"


# What each statistic means, shown on its name and on its value.
TIPS = {
    "speedup": (
        "A prediction, not a timed race: the reply's tokens divided by what its steps cost, each step priced on\n"
        "the cost curve the engine measured on this PC (a plain one-token step costs 1.0; a bigger batch costs\n"
        "more). Plain decoding is 1.0×. It knows the step counts and this PC's costs, not what else the CPU was\n"
        "doing, nor the time spent planning drafts. The Compare tab times plain and lookahead for real.\n"
        "\"–\": no step was priced (a reply saved before steps carried their cost)."
    ),
    "tokens_per_s": (
        "Reply tokens per second of decoding: the steps' wall time, drafting and checking included. Reading\n"
        "the prompt is not in it (see Prompt and Time to first token)."
    ),
    "tokens_per_step": (
        "Mean tokens added per forward pass of the model, over every step, steps that drafted nothing\n"
        "included (they add exactly 1). Plain decoding is always 1.00; each accepted draft token adds to it.\n"
        "In brackets: how many steps offered a draft at all."
    ),
    "acceptance": (
        "Of the draft tokens lookahead offered the model to check, how many it confirmed. Only steps that\n"
        "drafted count here, so 100% with few drafts still leaves tokens per step near 1."
    ),
    "first_token": "From Send to the reply's first token: waiting for the engine and reading the prompt included.",
    "tokens": "Tokens written / forward passes of the model that wrote them.",
    "prompt": (
        "The prompt's tokens, how many were reused from the cache (the chat so far, kept between turns),\n"
        "and how fast the rest were read"
    ),
    "shape": (
        "The last step: W (Jacobi window columns), N (n-gram size), G (n-gram guesses checked) and the batch,\n"
        "the tokens the model read in that one forward pass. Under Auto, what Auto chose; hover the value\n"
        "for why."
    ),
    "threads": (
        "CPU threads the last step ran with. When another program keeps a core busy, the engine gives that\n"
        "core up (a thread that shares a core slows every step) and tries it again a few seconds later."
    ),
    "caption": "Which reply these numbers belong to.",
}


class LiveStatsView(QWidget):
    """The chart plus tokens/s, tokens per step, accepted drafts, the estimate against plain, and the first token.

    A caption above says which reply the numbers are (the owner sets it: the running
    reply, or the last one of the chat in view, which may not be where it ran).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.caption = Label()
        self.caption.setWordWrap(True)
        self.caption.setToolTip(TIPS["caption"])
        self.chart = StepChart(self)
        # The headline: what the steps so far predict against plain decoding, and on what it rests.
        self.speedup = Label()
        font = self.speedup.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.25)
        self.speedup.setFont(font)
        self.speedup.setToolTip(TIPS["speedup"])
        self.speedup_note = Label("steps priced on this PC's measured costs")
        self.speedup_note.setWordWrap(True)
        self.speedup_note.setEnabled(False)  # the palette's quieter text
        self.speedup_note.setToolTip(TIPS["speedup"])
        self.tokens_per_s = Label()
        self.tokens_per_step = Label()
        self.acceptance = Label()
        self.first_token = Label()
        self.tokens = Label()
        self.prompt = Label()
        self.shape = Label()
        self.threads = Label()
        for label in (self.tokens_per_step, self.acceptance, self.prompt, self.shape, self.threads):
            label.setWordWrap(True)
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.setHorizontalSpacing(12)
        form.setVerticalSpacing(2)
        rows = (
            ("Tokens/s", self.tokens_per_s, "tokens_per_s"),
            ("Tokens per step", self.tokens_per_step, "tokens_per_step"),
            ("Drafts accepted", self.acceptance, "acceptance"),
            ("Time to first token", self.first_token, "first_token"),
            ("Prompt", self.prompt, "prompt"),
            ("Tokens / steps", self.tokens, "tokens"),
            ("Step shape", self.shape, "shape"),
            ("Threads", self.threads, "threads"),
        )
        self.row_names: dict[str, QLabel] = {}  # the names beside the values, by their TIPS key
        for name, value, tip in rows:
            name_label = Label(name)
            name_label.setToolTip(TIPS[tip])
            value.setToolTip(TIPS[tip])
            form.addRow(name_label, value)
            self.row_names[tip] = name_label
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.caption)
        headline = QHBoxLayout()
        headline.addWidget(self.speedup)
        headline.addWidget(self.speedup_note, 1)
        layout.addLayout(headline)
        layout.addWidget(self.chart, 1)
        layout.addLayout(form)
        self.reset()

    def reset(self, caption: str = "") -> None:
        """No numbers (before a reply, or for a chat without one), under ``caption`` (hidden when empty)."""
        self.chart.clear()
        for label in (self.tokens_per_s, self.tokens_per_step, self.acceptance, self.first_token,
                      self.tokens, self.prompt, self.threads, self.shape):
            label.setText("–")
        self.speedup.setText(speedup_text(RunStats()))
        self.speedup_note.setVisible(False)
        self.shape.setToolTip(TIPS["shape"])
        self.set_caption(caption)

    def set_caption(self, text: str) -> None:
        """Say which reply the numbers belong to ("" hides the caption)."""
        self.caption.setText(text)
        self.caption.setVisible(bool(text))

    def show_saved(self, stats: ReplyStats, caption: str) -> None:
        """A finished reply's stored statistics (what a reply keeps: no threads, no reason for its last shape)."""
        self.reset(caption)
        self.show_progress(stats, stats.per_step, None)
        self.shape.setText(f"{stats.mode} {stats.shape_text()}".strip() if stats.modes else "–")

    def show_progress(self, stats: ReplyStats, new_steps: list[int], last: StepEvent | None) -> None:
        """Update after a batch of steps (called at most ~30 times a second)."""
        self.chart.append(new_steps)
        self.speedup.setText(speedup_text(stats))
        self.speedup_note.setVisible(stats.predicted_speedup > 0)
        self.tokens_per_s.setText(f"{stats.tokens_per_s:.1f}")
        self.tokens_per_step.setText(tokens_per_step_text(stats))
        self.acceptance.setText(acceptance_text(stats))
        self.first_token.setText(f"{stats.first_token_s:.2f} s" if stats.first_token_s is not None else "–")
        self.tokens.setText(f"{stats.n_tokens} / {stats.steps}")
        if stats.prompt_tokens:
            self.prompt.setText(prompt_text(stats))
        if last is not None and last.threads:
            self.threads.setText(threads_text(last))
        if last is not None and last.mode == "lookahead":
            self.shape.setText(f"lookahead  W{last.window} N{last.ngram} G{last.guesses}  (batch {last.batch_size})")
        elif last is not None and last.mode == "auto":
            self.shape.setText(f"auto  {auto_step_text(last)}  (batch {last.batch_size})")
            self.shape.setToolTip(plain_tip(last.choice))
        elif last is not None and last.mode == "plain":
            self.shape.setText(f"plain  (batch {last.batch_size})")


def auto_step_text(event: StepEvent) -> str:
    """What Auto made of one step, e.g. ``3-token draft + window 4`` or ``plain step``."""
    what = f"{event.n_drafted}-token draft" if event.n_drafted else "plain step"
    if event.window:
        what += f" + window {event.window}"
    return what
