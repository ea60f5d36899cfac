"""``python -m engine bench``: plain against lookahead on a prompts file, a grid of fixed settings, or idle
against a busy core."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from engine.costs.curve import cpu_name
from engine.costs.whatif import CurveFileError, load_curve
from engine.decoding.runtime import Engine
from engine.decoding.settings import LookaheadConfig
from engine.speed.comparison import MIN_PAIRS, whole_blocks
from engine.speed.rows import PromptResult
from engine.speed.run_stats import geomean
from engine.speed.tables import speedup_cell
from engine.speed.workloads import Workload, attached_workloads, load_workloads
from engine.tools.bench import (
    BenchReport,
    llama_cpp_tps,
    parse_grid,
    perfect_draft_bound,
    run_bench,
    run_grid,
    run_one,
    workload_prompt,
)
from engine.tools.busybench import Cell, run_busy_bench
from engine.tools.commands.common import (
    CliError,
    add_lookahead_args,
    add_model_args,
    add_sampling_args,
    lookahead_from_args,
    open_engine,
    prepare_auto,
    sampling_from_args,
)

MAX_EXACT_PAIRS = 32  # --pairs: 64 runs of one prompt at most


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` and its options to the command line's subcommands ``sub``."""
    b = sub.add_parser("bench", help="plain vs lookahead on a prompts file")
    add_model_args(b)
    b.add_argument("--prompts", help="JSONL of {id, cat, prompt} (default: the repo's workloads)")
    b.add_argument("--max-tokens", type=int, default=128)
    add_lookahead_args(b)
    add_sampling_args(b)
    b.add_argument("--json", action="store_true")
    b.add_argument("--grid", help='measure a grid of fixed settings instead, e.g. "W=0,1,2;N=2,3,4;G=0,1,2"')
    b.add_argument("--only", help="comma-separated workload ids or categories to run")
    b.add_argument("--attach-dir", metavar="DIR",
                   help="attach every readable file in DIR to each prompt (--prompts', or three questions about "
                        "the files), as the docs category")
    b.add_argument("--no-references", action="store_true",
                   help="skip the llama-cpp-python Llama and fixed W=15/N=5/G=15 reference runs")
    b.add_argument("--reference-prompts", type=int, default=3,
                   help="prompts for the W=15/N=5/G=15 reference (default 3)")
    b.add_argument("--null", action="store_true",
                   help="time plain against plain on the same schedule: "
                        "the spread of its 'speedups' is this machine's noise")
    b.add_argument("--no-earlier-chats", action="store_true",
                   help="draft from each prompt alone, not also from the prompts before it and their replies")
    b.add_argument("--busy", action="store_true",
                   help="run plain and Auto idle and beside a busy loop on one core (started and stopped here), "
                        "with the thread governor, every thread fixed and one thread fixed, and print the speed "
                        "ratios and the governor's thread counts step by step")
    b.add_argument("--rounds", type=int, default=2, help="with --busy: idle/busy rounds (default 2)")
    b.add_argument("--replay", type=float, metavar="RIGHT",
                   help="offer each prompt's plain reply back as drafts, right at this share (0..1) of its positions "
                        "and wrong elsewhere: lookahead's speed on a model whose text nothing predicts (a shape with "
                        "random weights); the prompts draft from nothing else beyond themselves")
    b.add_argument("--pairs", type=int, metavar="N",
                   help="time every prompt in exactly N pairs of runs (an even number, 2 or more) instead of "
                        "stopping once they agree: one prompt's figure pinned down further, at N pairs' time")
    b.add_argument("--curve", help="plan and price on another machine's cost curve (a file from tune --save "
                                   "there); speedups are simulated")


def cmd_bench(args: argparse.Namespace) -> int:
    """``engine bench``: read the options, open the model, run the workloads, print the report. Kept in one
    piece: each option is read once, in the order the help lists them."""
    lookahead = lookahead_from_args(args)
    if lookahead is None:
        raise CliError("bench compares plain against lookahead: --mode plain makes no sense here")
    sampling = sampling_from_args(args)
    try:
        workloads = load_workloads(args.prompts)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read prompts: {exc}") from exc
    if args.attach_dir:
        try:
            workloads = attached_workloads(args.attach_dir, workloads if args.prompts else ())
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot attach from {args.attach_dir}: {exc}") from exc
    if args.only:
        keep = {x.strip() for x in args.only.split(",")}
        workloads = [w for w in workloads if w.id in keep or w.cat in keep]
        if not workloads:
            raise CliError(f"--only {args.only} matches no workload")
    if args.grid:
        return _bench_grid(args, workloads)
    if args.busy:
        return _bench_busy(args, workloads)
    if args.replay is not None and not 0.0 <= args.replay <= 1.0:
        raise CliError(f"--replay is the share of right drafts, from 0 to 1, not {args.replay}")
    if args.pairs is not None and not (whole_blocks(args.pairs) and args.pairs <= MAX_EXACT_PAIRS):
        raise CliError(f"--pairs takes an even number from {MIN_PAIRS} to {MAX_EXACT_PAIRS} (whole A-B-B-A blocks), "
                       f"not {args.pairs}")
    what_if = None
    if args.curve:
        if args.pairs is not None:
            raise CliError("--curve prices one run of each instead of timing them: --pairs has nothing to repeat")
        if args.null:
            raise CliError("--curve prices runs instead of timing them: --null has nothing to measure there")
        try:
            what_if = load_curve(args.curve)
        except CurveFileError as exc:
            raise CliError(str(exc)) from None
    with open_engine(args) as eng:
        def progress(r: PromptResult) -> None:
            if not args.json:
                differs = f"DIFFERS at {(r.first_divergence or {}).get('index')}"
                pairs = r.verdict.pairs if r.verdict is not None else 1
                looped = "  looped" + (" (stopped)" if r.stop_reason == "loop" else "") if r.looped else ""
                print(
                    f"{r.id:<18} {r.cat:<7} speedup {speedup_cell(r)} over {pairs} pair{'s' if pairs != 1 else ''}  "
                    f"tokens/step {r.tokens_per_step:.2f}  "
                    f"{'identical' if r.identical else differs}{looped}",
                    file=sys.stderr,
                )

        if what_if is not None:
            eng.plan_with(what_if)
        else:
            prepare_auto(eng, lookahead)
        report = run_bench(eng, workloads, lookahead, max_tokens=args.max_tokens, on_result=progress, null=args.null,
                           price_on=what_if, earlier_chats=not args.no_earlier_chats, replay=args.replay,
                           exact_pairs=args.pairs, sampling=sampling, loop_guard=args.loop_guard)
        references: dict[str, Any] = {"cost_curve": eng.cost_curve.to_json(),
                                      "perfect_draft_bound": round(perfect_draft_bound(eng.cost_curve), 4)}
        if what_if is None:  # what the runs' own step times made of the curve (a what-if curve learns nothing)
            references["live_costs"] = {str(n): {"cost": cost, "samples": samples}
                                        for n, (cost, samples) in eng.costs.live_costs.observed().items()}
        if not args.no_references and not args.null and what_if is None and args.replay is None:
            references.update(_references(args, eng, workloads, lookahead, report))
    out = report.to_json()
    out["references"] = references
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(report.table())
        print()
        print(eng.cost_curve.table())
        print(f"perfect drafts of any length would reach {references['perfect_draft_bound']:.3f}x on this curve")
        if references.get("live_costs"):
            print("as the runs' step times priced them (rows: cost with all logits, samples): " + ", ".join(
                f"{n}: {v['cost']:.2f} ({v['samples']})" for n, v in references["live_costs"].items()))
        if "plain_vs_llama_cpp" in references:
            print("plain (this engine) vs llama-cpp-python Llama greedy: "
                  f"geomean {references['plain_vs_llama_cpp']:.3f}x")
        for r in references.get("fixed_15_5_15", []):
            print(f"{r['id']}: this mode {r['mode_tps']:.1f} t/s, fixed W=15 N=5 G=15 {r['fixed_tps']:.1f} t/s "
                  f"({r['ratio']:.1f}x faster), identical {r['identical']}")
    return 0


def _bench_busy(args: argparse.Namespace, workloads: list[Workload]) -> int:
    """``bench --busy``: the first prompt of each category (or --only's), idle against one core busy."""
    if args.rounds < 1:
        raise CliError(f"--rounds must be >= 1, got {args.rounds}")
    if not args.only:
        firsts: dict[str, Workload] = {}
        for w in workloads:
            firsts.setdefault(w.cat, w)
        workloads = list(firsts.values())
    with open_engine(args) as eng:
        prepare_auto(eng, LookaheadConfig(auto=True))
        eng.probe_exact_cap()  # also finds whether the thread count may change (engine.threads_agree)

        def progress(load: str, mode: str, policy: str, cell: Cell) -> None:
            if not args.json:
                print(f"{load:<5} {mode:<6} {policy:<9} {cell.tokens_per_s:7.1f} tok/s so far", file=sys.stderr)

        report = run_busy_bench(eng, [w.prompt for w in workloads], max_tokens=args.max_tokens, rounds=args.rounds,
                                on_cell=progress)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(f"{len(workloads)} prompts x {args.max_tokens} tokens, {report.rounds} rounds, {report.threads} threads; "
              f"busy loop on CPU {report.busy_cpu}; {cpu_name()}")
        print(report.table())
    return 0


def _references(
    args: argparse.Namespace, eng: Engine, workloads: list[Workload], lookahead: LookaheadConfig, report: BenchReport
) -> dict:
    """The same run's context: llama-cpp-python's Llama, and llama.cpp's example shape."""
    prompts = []
    for w in workloads:  # the prompts the report timed, attached files included
        with workload_prompt(eng, w, args.max_tokens) as (prompt, _seen):
            prompts.append(prompt)
    print("reference: llama-cpp-python Llama greedy ...", file=sys.stderr)
    rates = llama_cpp_tps(eng.summary.path, prompts, args.max_tokens, eng.n_threads)
    ours = [r.bench.plain_tps_after_first if r.bench is not None else 0.0 for r in report.results]
    ratios = [a / b for a, b in zip(ours, rates, strict=False) if b > 0]
    fixed = []
    big = LookaheadConfig(window=15, ngram=5, guesses=15)
    for w, prompt in list(zip(workloads, prompts, strict=False))[: max(0, args.reference_prompts)]:
        print(f"reference: W=15 N=5 G=15 on {w.id} ...", file=sys.stderr)
        n = min(args.max_tokens, 48)
        mine = run_one(eng, prompt, lookahead, n)
        ref = run_one(eng, prompt, big, n, exact_only=False)  # the real 120-token steps
        fixed.append({"id": w.id, "mode_tps": round(mine.tokens_per_s, 2), "fixed_tps": round(ref.tokens_per_s, 2),
                      "ratio": round(mine.tokens_per_s / ref.tokens_per_s, 2) if ref.tokens_per_s else 0.0,
                      "fixed_tokens_per_step": round(ref.tokens_per_step, 2),
                      "identical": mine.token_ids == ref.token_ids})
    return {
        "llama_cpp_tps": [round(r, 2) for r in rates],
        "plain_vs_llama_cpp": round(geomean(ratios), 4),
        "fixed_15_5_15": fixed,
    }


def _bench_grid(args: argparse.Namespace, workloads: list) -> int:
    try:
        configs = parse_grid(args.grid)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    with open_engine(args) as eng:
        rows = run_grid(eng, workloads, configs, max_tokens=args.max_tokens,
                        on_prompt=lambda i: print(f"done {i}", file=sys.stderr))
    rows.sort(key=lambda r: r.geomean, reverse=True)
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
        return 0
    cats = sorted({c for r in rows for c in r.by_cat})
    print(f"{'W':>2} {'N':>2} {'G':>2} {'geomean':>8} " + " ".join(f"{c:>7}" for c in cats) + "  tok/step  same")
    for r in rows:
        print(f"{r.window:>2} {r.ngram:>2} {r.guesses:>2} {r.geomean:>8.3f} "
              + " ".join(f"{r.by_cat.get(c, 0):>7.3f}" for c in cats)
              + f"  {r.tokens_per_step:>8.2f}  {r.identical}/{r.n}")
    return 0
