"""The speed tables: one home for the columns of the per-prompt rows, their cells, and the texts made of them.

``engine bench`` prints the rows as a console table (``console_table``), the app's speed report shows them in
its dialog and exports them (``prompt_cells``, ``category_cells``, ``report_markdown``, ``report_csv``). Both
show the same columns in the same order, each defined once in ``PROMPT_COLUMNS``. Where they differ it is on
purpose: the console has short headings, fixed widths, three decimals for the prediction and the oracle's
bound (its own column); the report words a reader reads (× signs, "–" where there is no figure).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.speed.comparison import BUSY_NOTE
from engine.speed.rows import CategoryRow, Loops, PromptResult, by_category


def speedup_cell(r: PromptResult) -> str:
    """A row's speedup as a table shows it: claimed only where its repeats measured one."""
    v = r.verdict
    if v is None:  # a row from before repeats were recorded: the one ratio there is
        return f"{r.speedup:.2f}×"
    if v.same_steps:
        return "same steps"
    range_ = f"{v.speedup_low:.2f}–{v.speedup_high:.2f}"
    if not v.measurable:
        return f"no difference ({range_}×)"
    return f"{r.speedup:.2f}× ({range_})"


def priced_cell(r: PromptResult) -> str:
    """A speedup priced on a what-if curve rather than timed: one ratio, no repeats to range over."""
    return f"{r.speedup:.3f} priced"


def ratio_cell(x: float) -> str:
    """A ratio as the report words it: "1.25×", or "–" where there is none."""
    return f"{x:.2f}×" if x > 0 else "–"


@dataclass(frozen=True)
class Column:
    """A column of the per-prompt table, as the speed report and as ``engine bench``'s console show it."""

    heading: str | None  # the report's (None: the console's column only)
    short: str  # the console's heading
    width: int  # the console's: right-aligned, left-aligned when negative, as it comes when 0
    cell: Callable[[PromptResult], str]  # the report's cell, and the console's ...
    console_cell: Callable[[PromptResult], str] | None = None  # ... unless it shows the figure otherwise

    def console(self, r: PromptResult) -> str:
        return (self.console_cell or self.cell)(r)


def _oracle(r: PromptResult) -> str:
    return f"{r.bench.oracle_bound if r.bench is not None else 0:.3f}"


SPEEDUP = Column("speedup", "speedup (range)", -27, speedup_cell)
PROMPT_COLUMNS: tuple[Column, ...] = (
    Column("id", "id", -18, lambda r: r.id),
    Column("category", "cat", -7, lambda r: r.cat),
    Column("tokens", "tok", 4, lambda r: str(r.n_tokens)),
    Column("plain tok/s", "plain t/s", 9, lambda r: f"{r.plain_tps:.1f}"),
    Column("lookahead tok/s", "la t/s", 8, lambda r: f"{r.lookahead_tps:.1f}"),
    SPEEDUP,
    Column("steps predict", "predict", 7, lambda r: ratio_cell(r.steps_predict), lambda r: f"{r.steps_predict:.3f}"),
    Column("tokens/step", "tok/step", 8, lambda r: f"{r.tokens_per_step:.2f}"),
    Column(None, "oracle", 6, _oracle),
    Column("identical", "same", 0, lambda r: "yes" if r.identical else "no", lambda r: "yes" if r.identical else "NO"),
)
PROMPT_HEADINGS = tuple(c.heading for c in PROMPT_COLUMNS if c.heading is not None)
CATEGORY_HEADINGS = (
    "category", "prompts", "speedup (geomean)", "steps predict (geomean)", "tokens/step (mean)", "identical",
)


# --- engine bench's console ---


def _console_line(cells: Sequence[str]) -> str:
    return " ".join(f"{cell:<{-c.width}}" if c.width < 0 else f"{cell:>{c.width}}"
                    for c, cell in zip(PROMPT_COLUMNS, cells, strict=True))


def console_table(results: Sequence[PromptResult], priced: bool = False) -> list[str]:
    """The heading line, then a line per row. ``priced``: the speedups were priced on a what-if curve."""
    lines = [_console_line([c.short for c in PROMPT_COLUMNS])]
    for r in results:
        lines.append(_console_line([priced_cell(r) if priced and c is SPEEDUP else c.console(r)
                                    for c in PROMPT_COLUMNS]))
    return lines


# --- the app's speed report ---


def prompt_cells(r: PromptResult) -> list[str]:
    """A row's cells under ``PROMPT_HEADINGS``."""
    return [c.cell(r) for c in PROMPT_COLUMNS if c.heading is not None]


def category_cells(c: CategoryRow) -> list[str]:
    """A category's cells under ``CATEGORY_HEADINGS``."""
    return [c.cat, str(c.n), f"{c.speedup:.2f}×", ratio_cell(c.steps_predict), f"{c.tokens_per_step:.2f}",
            f"{c.identical}/{c.n}"]


def report_summary(results: Sequence[PromptResult]) -> str:
    """One paragraph over every row: the measured and the predicted gain, and what no row may claim."""
    if not results:
        return "No prompts measured."
    overall = by_category(results)[-1]
    n = len(results)
    text = f"Lookahead {overall.speedup:.2f}× as fast as plain (geometric mean of {n} prompt{'s' if n != 1 else ''})"
    text += f"; the steps predict {overall.steps_predict:.2f}×." if overall.steps_predict > 0 else "."
    verdicts = [r.verdict for r in results if r.verdict is not None]
    same = sum(v.same_steps for v in verdicts)
    unclear = sum(not v.measurable and not v.same_steps for v in verdicts)
    if same:
        text += f" {same} of {n} took the same steps as plain: no speedup to claim there."
    if unclear:
        text += f" {unclear} of {n} showed no measurable difference (their repeats spanned 1.00×)."
    loops = Loops.of(results)
    if loops.looped:
        text += (f" {loops.looped} of {n} replies repeated themselves ({loops.stopped} stopped by the loop guard): a "
                 f"loop's drafts land easily, so it flatters lookahead")
        text += f"; over the other {len(loops.kept)}, {loops.kept_speedup:.2f}×." if loops.kept else "."
    if any(v.busy for v in verdicts):
        text += f" {BUSY_NOTE}"
    return text


def report_csv(results: Sequence[PromptResult]) -> str:
    """One row per prompt, then one per category (its id column empty), as CSV."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "category", "tokens", "plain_tok_s", "lookahead_tok_s", "speedup", "tokens_per_step",
                     "identical", "plain_s", "lookahead_s", "speedup_low", "speedup_high", "pairs", "steps_predict",
                     "same_steps", "busy"])
    for r in results:
        v = r.verdict
        repeats = ["", "", "", "", "", ""] if v is None else [
            v.speedup_low, v.speedup_high, v.pairs, v.steps_predict, _yes_no(v.same_steps), _yes_no(v.busy)]
        writer.writerow([r.id, r.cat, r.n_tokens, r.plain_tps, r.lookahead_tps, r.speedup, r.tokens_per_step,
                         "yes" if r.identical else "no", r.plain_s, r.lookahead_s, *repeats])
    for c in by_category(results):
        writer.writerow(["", c.cat, "", "", "", round(c.speedup, 4), round(c.tokens_per_step, 3),
                         f"{c.identical}/{c.n}", "", "", "", "", "", round(c.steps_predict, 4), "", ""])
    return out.getvalue()


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def report_markdown(results: Sequence[PromptResult], title: str = "Speed report") -> str:
    """The two tables (per prompt, per category) and the summary, as Markdown."""

    def table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        return lines

    lines = [f"## {title}", "", report_summary(results), ""]
    lines += table(PROMPT_HEADINGS, [prompt_cells(r) for r in results])
    lines += ["", "### By category", ""]
    lines += table(CATEGORY_HEADINGS, [category_cells(c) for c in by_category(results)])
    return "\n".join(lines) + "\n"

