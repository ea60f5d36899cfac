"""The speed tables: ``engine bench``'s console table and the speed report's cells, from one set of columns.

The texts below are what each printed before the two shared their columns: the console's widths, three
decimals and "NO", the report's × signs, "–" and "no".
"""

from __future__ import annotations

from engine.speed.rows import BenchFigures, PromptResult, VerdictFigures, by_category
from engine.speed.tables import category_cells, console_table, prompt_cells, report_summary

REPEATS = VerdictFigures(plain_first=True, speedup_low=1.3, speedup_high=1.7, pairs=4, steps_predict=1.45,
                         same_steps=False, measurable=True, busy=False)


def _row(pid: str, cat: str, speedup: float, tps: float, identical: bool, verdict: VerdictFigures | None = None,
         bench: BenchFigures | None = None) -> PromptResult:
    return PromptResult(id=pid, cat=cat, n_tokens=64, plain_tps=10.0, lookahead_tps=round(10.0 * speedup, 2),
                        speedup=speedup, tokens_per_step=tps, identical=identical, first_divergence=None,
                        verdict=verdict, bench=bench)


ROWS = [
    _row("old1", "code", 2.0, 2.5, True),  # from before repeats were recorded: the one ratio
    _row("v1", "chat", 1.5, 1.8, True, REPEATS),
    _row("same", "chat", 1.02, 1.0, True, VerdictFigures(True, 0.97, 1.05, 4, 1.0, True, False, False)),
    _row("unclear", "docs", 1.04, 1.3, False, VerdictFigures(False, 0.95, 1.12, 4, 1.45, False, False, True)),
    _row("b1", "code", 1.6, 2.0, True, REPEATS, BenchFigures(oracle_bound=2.5, runs=8)),
]


def test_the_bench_prints_each_column_at_its_width_with_the_oracles_bound():
    assert console_table(ROWS) == [
        "id                 cat      tok plain t/s   la t/s speedup (range)             predict tok/step oracle same",
        "old1               code      64      10.0     20.0 2.00×                         0.000     2.50  0.000 yes",
        "v1                 chat      64      10.0     15.0 1.50× (1.30–1.70)             1.450     1.80  0.000 yes",
        "same               chat      64      10.0     10.2 same steps                    1.000     1.00  0.000 yes",
        "unclear            docs      64      10.0     10.4 no difference (0.95–1.12×)    1.450     1.30  0.000 NO",
        "b1                 code      64      10.0     16.0 1.60× (1.30–1.70)             1.450     2.00  2.500 yes",
    ]


def test_a_priced_bench_shows_the_priced_ratio_and_no_range():
    assert console_table(ROWS[:2], priced=True)[1:] == [
        "old1               code      64      10.0     20.0 2.000 priced                  0.000     2.50  0.000 yes",
        "v1                 chat      64      10.0     15.0 1.500 priced                  1.450     1.80  0.000 yes",
    ]


def test_the_speed_report_words_the_same_columns_for_a_reader():
    assert [prompt_cells(r) for r in ROWS] == [
        ["old1", "code", "64", "10.0", "20.0", "2.00×", "–", "2.50", "yes"],
        ["v1", "chat", "64", "10.0", "15.0", "1.50× (1.30–1.70)", "1.45×", "1.80", "yes"],
        ["same", "chat", "64", "10.0", "10.2", "same steps", "1.00×", "1.00", "yes"],
        ["unclear", "docs", "64", "10.0", "10.4", "no difference (0.95–1.12×)", "1.45×", "1.30", "no"],
        ["b1", "code", "64", "10.0", "16.0", "1.60× (1.30–1.70)", "1.45×", "2.00", "yes"],
    ]


def test_the_report_rolls_the_steps_prediction_up_by_category_where_rows_recorded_one():
    assert [category_cells(c) for c in by_category(ROWS)] == [
        ["code", "2", "1.79×", "1.45×", "2.25", "2/2"],
        ["chat", "2", "1.24×", "1.20×", "1.40", "2/2"],
        ["docs", "1", "1.04×", "1.45×", "1.30", "0/1"],
        ["all", "5", "1.38×", "1.32×", "1.72", "4/5"],
    ]
    assert report_summary(ROWS) == (
        "Lookahead 1.38× as fast as plain (geometric mean of 5 prompts); the steps predict 1.32×. 1 of 5 took the "
        "same steps as plain: no speedup to claim there. 1 of 5 showed no measurable difference (their repeats "
        "spanned 1.00×). Another program was using the CPU during this run: times may be off."
    )


def test_the_report_says_how_many_replies_looped_and_the_gain_over_the_others():
    rows = [_row("a", "code", 1.2, 2.0, True, REPEATS), _row("b", "chat", 3.0, 5.0, True, REPEATS),
            _row("c", "chat", 1.5, 2.0, True, REPEATS)]
    rows[1].looped, rows[1].stop_reason = True, "loop"
    text = report_summary(rows)
    assert "1 of 3 replies repeated themselves (1 stopped by the loop guard)" in text
    assert "over the other 2, 1.34×." in text  # sqrt(1.2 * 1.5)
    assert "repeated" not in report_summary(rows[:1] + rows[2:])
