"""``python -m engine shape``: write a model in a real model's shape with random weights, for benchmarks."""

from __future__ import annotations

import argparse
import sys

from engine.tools.commands.common import EXIT_FAILED, CliError
from engine.tools.shapes import QUANT_TYPES, SHAPES, build_shape


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``shape`` and its options to the command line's subcommands ``sub``."""
    s = sub.add_parser("shape", help="write a model in a real model's shape with random weights, for benchmarks")
    s.add_argument("name", nargs="?", choices=list(SHAPES), metavar="NAME",
                   help=f"the shape: {', '.join(SHAPES)} (--list describes them)")
    s.add_argument("out", nargs="?", metavar="OUT.gguf", help="the file to write")
    s.add_argument("--type", choices=list(QUANT_TYPES), default="q4_k_m",
                   help="file type, quantized by llama.cpp as llama-quantize does (default q4_k_m)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    s.add_argument("--list", action="store_true", help="list the shapes and exit")


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
