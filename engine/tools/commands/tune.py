"""``python -m engine tune``: measure this machine's cost curve, and show what Auto will do on it."""

from __future__ import annotations

import argparse
import json

from engine.costs.calibration import MachineBusy
from engine.costs.contention import WINDOW
from engine.costs.curve import CostCurve
from engine.costs.exactness import EXACT_PROBE_SIZES
from engine.costs.whatif import save_curve
from engine.llama import backend
from engine.llama.kernels import explain_exact_limit, matrix_kernels
from engine.tools.commands.common import EXIT_FAILED, CliError, add_model_args, open_engine


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``tune`` and its options to the command line's subcommands ``sub``."""
    t = sub.add_parser("tune", help="measure this machine's cost curve for Auto and show what Auto will do")
    add_model_args(t)
    t.add_argument("--json", action="store_true")
    t.add_argument("--cached", action="store_true", help="show the cached curve instead of measuring again")
    t.add_argument("--save", metavar="FILE", help="also write the curve to FILE (for bench --curve elsewhere)")


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
        kernels = matrix_kernels(dict(eng.summary.matrix_types), backend.system_features())
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
