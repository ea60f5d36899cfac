"""Command line: ``python -m engine generate | bench | tune | chat | shape``.

Bad input (missing or broken model, prompt too long, invalid settings) ends
with one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from engine.costs.contention import WINDOW
from engine.costs.curve import CostCurve, cpu_name
from engine.costs.measuring import EXACT_PROBE_SIZES, MachineBusy
from engine.costs.whatif import CurveFileError, load_curve, save_curve
from engine.decoding.runtime import (
    Engine,
    GenerationControls,
    LookaheadUnsupportedError,
    PromptTooLongError,
    default_threads,
)
from engine.decoding.session import ChatSession
from engine.decoding.settings import DEFAULT_LOOKAHEAD, LookaheadConfig, SamplingConfig, StopConfig
from engine.decoding.text import Message, TemplateRenderError, conversation_messages
from engine.documents import Document, DocumentContext, DocumentError, read_document, with_documents
from engine.llama import native
from engine.llama.bundled import default_model_path
from engine.llama.kernels import explain_exact_limit, matrix_kernels
from engine.llama.native import NativeError
from engine.llama.probe import ensure_loadable
from engine.llama.problems import ModelFileError, SettingsError
from engine.speed.comparison import speedup_cell
from engine.speed.measure import PromptResult, RunStats, Workload, geomean
from engine.speed.workloads import attached_workloads, load_workloads
from engine.tools import serve
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
from engine.tools.shapes import QUANT_TYPES, SHAPES, build_shape

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


class CliError(Exception):
    """A user-facing error: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        raise CliError(f"{self.prog}: {message}")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF model file (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads, kept as given (default: one per physical performance core, at most 8, "
                        "one fewer while another program keeps a core busy)")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")


def _add_lookahead_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["plain", "lookahead", "auto"], default=None,
                   help="default: lookahead with Auto sizing (plain when the model cannot do lookahead)")
    p.add_argument("--window", type=int, default=None, help="lookahead window W (0..16)")
    p.add_argument("--ngram", type=int, default=None, help="n-gram size N (2..8)")
    p.add_argument("--guesses", type=int, default=None, help="verification candidates G (0..16)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="Lookahead Chat decoding engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text for one prompt")
    _add_model_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    g.add_argument("--chat", action="store_true", help="send the prompt as a user message with the chat template")
    g.add_argument("--system", default="", help="system prompt (with --chat)")
    _add_lookahead_args(g)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    d = SamplingConfig()
    g.add_argument("--top-k", type=int, default=d.top_k,
                   help=f"sample from the k likeliest tokens (0 = all; default {d.top_k})")
    g.add_argument("--top-p", type=float, default=d.top_p, help=f"nucleus sampling threshold (default {d.top_p})")
    g.add_argument("--min-p", type=float, default=d.min_p,
                   help=f"drop tokens below this fraction of the likeliest one's probability (default {d.min_p})")
    g.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty,
                   help="penalise tokens seen in the last --repeat-last-n tokens, also when greedy (1 = off; 1..2)")
    g.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n,
                   help=f"how many recent tokens the penalty looks at (0 = off; default {d.repeat_last_n})")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the reply before this text (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    g.add_argument("--attach", action="append", default=[], metavar="FILE",
                   help="attach a file to the prompt (repeatable): text, Markdown, code, CSV, JSON, HTML, PDF or "
                        "DOCX; whole if it fits, else its passages that best match the prompt; drafts use all of it")

    b = sub.add_parser("bench", help="plain vs lookahead on a prompts file")
    _add_model_args(b)
    b.add_argument("--prompts", help="JSONL of {id, cat, prompt} (default: the repo's workloads)")
    b.add_argument("--max-tokens", type=int, default=128)
    _add_lookahead_args(b)
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
    b.add_argument("--curve", help="plan and price on another machine's cost curve (a file from tune --save "
                                   "there); speedups are simulated")

    t = sub.add_parser("tune", help="measure this machine's cost curve for Auto and show what Auto will do")
    _add_model_args(t)
    t.add_argument("--json", action="store_true")
    t.add_argument("--cached", action="store_true", help="show the cached curve instead of measuring again")
    t.add_argument("--save", metavar="FILE", help="also write the curve to FILE (for bench --curve elsewhere)")

    c = sub.add_parser("chat", help="chat in the terminal")
    _add_model_args(c)
    _add_lookahead_args(c)
    c.add_argument("--system", default="")
    c.add_argument("--max-tokens", type=int, default=512)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--attach", action="append", default=[], metavar="FILE",
                   help="attach a file to the chat (repeatable): given with the first message, drafted from throughout")

    s = sub.add_parser("shape", help="write a model in a real model's shape with random weights, for benchmarks")
    s.add_argument("name", nargs="?", choices=list(SHAPES), metavar="NAME",
                   help=f"the shape: {', '.join(SHAPES)} (--list describes them)")
    s.add_argument("out", nargs="?", metavar="OUT.gguf", help="the file to write")
    s.add_argument("--type", choices=list(QUANT_TYPES), default="q4_k_m",
                   help="file type, quantized by llama.cpp as llama-quantize does (default q4_k_m)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    s.add_argument("--list", action="store_true", help="list the shapes and exit")

    serve.add_parser(sub, _add_model_args)
    return parser


def lookahead_from_args(args: argparse.Namespace, eng: Engine | None = None) -> LookaheadConfig | None:
    if args.mode == "plain":
        return None
    if args.mode is None and eng is not None and eng.lookahead_block_reason:
        # Not asked for explicitly: fall back to plain decoding and say why.
        print(f"note: {eng.lookahead_block_reason}", file=sys.stderr)
        return None
    base = DEFAULT_LOOKAHEAD
    cfg = LookaheadConfig(
        window=base.window if args.window is None else args.window,
        ngram=base.ngram if args.ngram is None else args.ngram,
        guesses=base.guesses if args.guesses is None else args.guesses,
        auto=args.mode == "auto" or (base.auto and args.window is None and args.ngram is None and args.guesses is None),
    )
    return cfg.validate()


def open_engine(args: argparse.Namespace) -> Engine:
    """The engine for ``--model``/``--ctx``/``--threads``; a file opened for the first time is test-loaded
    in a child process first, so damage that would crash llama.cpp ends as one error line (engine/llama/probe.py)."""
    path = Path(args.model) if args.model else default_model_path()
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    checked = ensure_loadable(path, n_ctx=args.ctx, n_threads=args.threads or default_threads())
    return Engine(path, n_ctx=args.ctx, n_threads=args.threads, summary=checked.summary)


def prepare_auto(eng: Engine, lookahead: LookaheadConfig | None) -> None:
    """For benchmarks: Auto plans with this machine's cost curve; load it, or measure it once and say so.

    ``generate`` and ``chat`` do not measure: Auto uses the curve ``engine tune`` saved, or the
    reference curve within a quickly probed exact batch size, as the app's first replies do.
    """
    if lookahead is None or not lookahead.auto or eng.load_cached_curve():
        return
    print("note: measuring this machine for lookahead (once per model and thread count)…", file=sys.stderr)
    try:
        eng.tune()
    except MachineBusy:
        print("note: another program was using the CPU, so nothing was measured: Auto plans with its reference "
              "curve this time", file=sys.stderr)


def read_attachments(paths: list[str]) -> list[Document]:
    """The ``--attach`` files' text; a file that cannot be used stops the command with its reason."""
    docs = []
    for path in paths:
        try:
            docs.append(read_document(path))
        except DocumentError as exc:
            raise CliError(f"cannot attach {path}: {exc.reason}") from None
    return docs


def attach_to(eng: Engine, session: ChatSession, messages: list[Message], docs: list[Document],
              max_tokens: int) -> DocumentContext:
    """Put ``docs`` (whole, or their best passages) into the last message and let the engine draft from them."""
    context = session.documents_context(messages, docs, max_tokens)
    messages[-1] = Message(messages[-1].role, with_documents(messages[-1].content, context))
    eng.set_documents([d.text for d in docs])
    seen = ", ".join(f"{name} {fraction:.0%}" for name, fraction in context.coverage.items())
    print(f"note: attached ({'whole' if context.whole else 'best passages'}): {seen}", file=sys.stderr)
    return context


def cmd_generate(args: argparse.Namespace) -> int:
    if args.prompt_file:
        try:
            prompt_text = Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read prompt file {args.prompt_file}: {exc}") from exc
    else:
        prompt_text = args.prompt
    lookahead = lookahead_from_args(args)
    sampling = SamplingConfig(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
    ).validate()
    stop = StopConfig(max_tokens=args.max_tokens, stop_strings=tuple(args.stop)).validate()
    docs = read_attachments(args.attach)
    with open_engine(args) as eng:
        lookahead = lookahead_from_args(args, eng)
        controls = GenerationControls(lookahead=lookahead)
        context = None
        if args.chat:
            messages = conversation_messages(args.system or "", user_text=prompt_text)
            if docs:
                context = attach_to(eng, ChatSession(eng), messages, docs, args.max_tokens)
            events = ChatSession(eng).reply(messages, controls=controls, sampling=sampling, stop=stop)
        else:
            if docs:  # a raw prompt: the passages go before it, as in a chat message
                raw = [Message("user", prompt_text)]
                context = attach_to(eng, ChatSession(eng), raw, docs, args.max_tokens)
                prompt_text = raw[-1].content
            events = eng.generate(eng.tokenize(prompt_text), controls=controls, sampling=sampling, stop=stop)
        summary = RunStats()
        shapes = []
        token_sources: list[str] = []
        for ev in events:
            summary.observe(ev)
            token_sources.extend(ev.token_sources)
            if ev.mode != "none":
                shapes.append((ev.window, ev.ngram, ev.guesses))
            if not args.json and ev.text:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        if args.json:
            w, n, g = shapes[-1] if shapes else (0, 0, 0)
            print(
                json.dumps(
                    {
                        "text": summary.text,
                        "token_ids": summary.token_ids,
                        "n_tokens": summary.n_tokens,
                        "steps": summary.steps,
                        "tokens_per_step": round(summary.tokens_per_step, 4),
                        "elapsed_s": round(summary.elapsed_s, 4),
                        "prefill_s": round(summary.prefill_s, 4),
                        "prompt_tokens": summary.prompt_tokens,
                        "prompt_cached_tokens": summary.prompt_cached_tokens,
                        "prompt_tokens_per_s": round(summary.prompt_tokens_per_s, 1),
                        "token_sources": token_sources,
                        "first_token_s": round(summary.first_token_s or 0.0, 4),
                        "tokens_per_s": round(summary.tokens_per_s, 2),
                        "mode": "plain" if lookahead is None else ("auto" if lookahead.auto else "lookahead"),
                        "window": lookahead.window if lookahead else 0,
                        "ngram": lookahead.ngram if lookahead else 0,
                        "guesses": lookahead.guesses if lookahead else 0,
                        "last_step_shape": {"window": w, "ngram": n, "guesses": g},
                        "n_drafted": summary.n_drafted,
                        "n_accepted": summary.n_accepted,
                        "accepted_by_source": summary.accepted_by_source,
                        "documents": {} if context is None else {
                            "whole": context.whole, "seen": context.coverage,
                            "citations": [{"name": c.name, "where": c.where} for c in context.citations]},
                        "stop_reason": summary.stop_reason,
                        "model": eng.summary.path,
                    },
                    ensure_ascii=False,
                )
            )
        else:
            sys.stdout.write("\n")
            print(
                f"[{summary.n_tokens} tokens, {summary.steps} steps, {summary.tokens_per_step:.2f} tokens/step, "
                f"{summary.tokens_per_s:.1f} tokens/s, stop: {summary.stop_reason}]",
                file=sys.stderr,
            )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    lookahead = lookahead_from_args(args)
    if lookahead is None:
        raise CliError("bench compares plain against lookahead: --mode plain makes no sense here")
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
    what_if = None
    if args.curve:
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
                pairs = r.extra.get("pairs", 1)
                print(
                    f"{r.id:<18} {r.cat:<7} speedup {speedup_cell(r)} over {pairs} pair{'s' if pairs != 1 else ''}  "
                    f"tokens/step {r.tokens_per_step:.2f}  "
                    f"{'identical' if r.identical else differs}",
                    file=sys.stderr,
                )

        if what_if is not None:
            eng.plan_with(what_if)
        else:
            prepare_auto(eng, lookahead)
        report = run_bench(eng, workloads, lookahead, max_tokens=args.max_tokens, on_result=progress, null=args.null,
                           price_on=what_if, earlier_chats=not args.no_earlier_chats, replay=args.replay)
        extra: dict[str, Any] = {"cost_curve": eng.cost_curve.to_json(),
                 "perfect_draft_bound": round(perfect_draft_bound(eng.cost_curve), 4)}
        if not args.no_references and not args.null and what_if is None and args.replay is None:
            extra.update(_references(args, eng, workloads, lookahead, report))
    out = report.to_json()
    out["references"] = extra
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(report.table())
        print()
        print(eng.cost_curve.table())
        print(f"perfect drafts of any length would reach {extra['perfect_draft_bound']:.3f}x on this curve")
        if "plain_vs_llama_cpp" in extra:
            print(f"plain (this engine) vs llama-cpp-python Llama greedy: geomean {extra['plain_vs_llama_cpp']:.3f}x")
        for r in extra.get("fixed_15_5_15", []):
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
    ours = [r.extra["plain_tps_after_first"] for r in report.results]
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


def auto_plan(curve: CostCurve) -> dict:
    """What Auto does on this curve: the least per-token acceptance p that makes a draft of L tokens pay."""
    from engine.decoding.auto import break_even_p

    rows = {}
    for L in (1, 2, 3, 4, 6, 8, 12, 15):
        need = break_even_p(curve, L)
        rows[L] = round(need, 3) if need < 1.0 else None
    window = curve.cost(1 + 3 * 2 + 2, 4) / curve.cost(1)
    return {"min_p_for_draft_len": rows, "window_3x2_relative_cost": round(window, 3),
            "max_exact_batch": curve.max_exact_batch}


def cmd_tune(args: argparse.Namespace) -> int:
    with open_engine(args) as eng:
        try:
            curve = eng.tune(refresh=not args.cached)
        except MachineBusy:
            raise CliError("another program was using the CPU while this PC was being measured, so nothing was "
                           "measured: run engine tune again when the PC is quieter", EXIT_FAILED) from None
        model = eng.summary.name
        kernels = matrix_kernels(dict(eng.summary.matrix_types), native.system_features())
        drafts_only, rollback = eng.drafts_only, eng.rollback
    if args.save:
        try:
            save_curve(curve, args.save, model=model, threads=curve.threads)
        except OSError as exc:
            raise CliError(f"cannot write {args.save}: {exc.strerror or exc}") from None
    plan = auto_plan(curve)
    if args.json:
        print(json.dumps({"curve": curve.to_json(), "auto": plan,
                          "kernels": [{"type": k.ggml_type, "tensors": k.n_tensors, "kernel": k.kernel,
                                       "exact_up_to": k.exact_up_to} for k in kernels]}))
        return 0
    print(curve.table())
    # A model that verifies one draft at a time is probed only as far as its memory can take back.
    largest = rollback + 1 if drafts_only else max(EXACT_PROBE_SIZES)
    exact = explain_exact_limit(kernels, curve.max_exact_batch, largest)
    print(f"measured in {curve.measured_s:.1f} s; {exact}")
    one = curve.one_thread
    if one is not None:
        sizes = [n for n in (2, 4, 8, 16) if n in one.sizes]
        costs = ", ".join(f"{n}: {one.cost(n):.2f}" for n in sizes)
        print(f"on one thread (beside a program that holds a core): a 1-token step {one.base_ms:.2f} ms "
              f"({one.base_ms / curve.base_ms:.2f}x), batches with all logits {costs}")
    if curve.rest_floor is not None:
        print(f"at rest, {curve.threads} threads had {curve.rest_floor:.0%} of their cores or more (windows of "
              f"{WINDOW} 1-token steps); below {curve.rest.busy_below:.0%} another program counts as busy")
    print("Weight matrices, and the kernel that multiplies a batch by them on this build:")
    for kernel in kernels:
        print(f"  {kernel.describe}")
    print("A draft of L tokens beats a plain step only if each of its tokens lands with probability at least:")
    for L, p in plan["min_p_for_draft_len"].items():
        print(f"  L={L}: p >= {p:.2f}" if p is not None else f"  L={L}: never pays")
    if drafts_only:
        print(f"this model verifies one draft of up to {rollback} tokens per step (its memory is recurrent in part): "
              "no Jacobi window")
    else:
        print(f"A 3-column, N=3 Jacobi window would make a step cost {plan['window_3x2_relative_cost']:.2f}x a plain "
              "one; Auto runs one only when that is nearly free.")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    lookahead = lookahead_from_args(args)
    sampling = SamplingConfig(temperature=args.temperature, seed=args.seed).validate()
    stop = StopConfig(max_tokens=args.max_tokens).validate()
    with open_engine(args) as eng:
        lookahead = lookahead_from_args(args, eng)
        session = ChatSession(eng)
        messages = conversation_messages(args.system or "")
        docs = read_attachments(args.attach)
        print(f"Model: {eng.summary.name} ({eng.summary.file_type}). Empty line or Ctrl+D to quit.", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            messages.append(Message("user", line))
            if docs:  # the files go with the first message; the engine drafts from them all chat long
                attach_to(eng, session, messages, docs, args.max_tokens)
                docs = []
            controls = GenerationControls(lookahead=lookahead)
            summary = RunStats()
            try:
                for ev in session.reply(messages, controls=controls, sampling=sampling, stop=stop):
                    summary.observe(ev)
                    if ev.notice:
                        print(f"[{ev.notice}]", file=sys.stderr)
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                controls.cancel.set()
            except PromptTooLongError as exc:
                print(f"error: {exc}", file=sys.stderr)
                messages.pop()
                continue
            messages.append(Message("assistant", summary.text))
            print(
                f"\n[{summary.tokens_per_s:.1f} tokens/s, {summary.tokens_per_step:.2f} tokens/step]",
                file=sys.stderr,
            )
    return 0


def cmd_shape(args: argparse.Namespace) -> int:
    if args.list:
        for shape in SHAPES.values():
            print(f"{shape.name:<14} {shape.arch:<7} {shape.n_params / 1e6:>6.0f}M parameters  {shape.description}")
        return 0
    if args.name is None or args.out is None:
        raise CliError("shape needs a shape NAME and an OUT.gguf file (or --list)")
    try:
        built = build_shape(SHAPES[args.name], args.out, args.type, seed=args.seed,
                            progress=lambda message: print(f"note: {message}…", file=sys.stderr))
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc.strerror or exc}", EXIT_FAILED) from None
    types = ", ".join(f"{name} {count}" for name, count in built.tensor_types.items())
    print(f"wrote {built.path}: {built.size_bytes / 1e6:.1f} MB, {built.quant_type.upper()}, "
          f"{built.n_tensors} tensors ({types}) in {built.seconds:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        handler = {"generate": cmd_generate, "bench": cmd_bench, "chat": cmd_chat, "tune": cmd_tune,
                   "shape": cmd_shape, "serve": lambda a: serve.cmd_serve(a, open_engine, prepare_auto)}[args.command]
        return handler(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except (ModelFileError, SettingsError, PromptTooLongError, TemplateRenderError, LookaheadUnsupportedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NativeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        print("error: out of memory (try a smaller --ctx)", file=sys.stderr)
        return EXIT_FAILED
