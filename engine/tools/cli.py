"""Command line: ``python -m engine generate | bench | tune | chat | shape | serve``.

Each command is a module of engine/tools/commands/ (serve's is engine/tools/serve.py): its options and its
work. Here they are put together into one parser, and a failure becomes an exit code.

Bad input (missing or broken model, prompt too long, invalid settings) ends
with one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import NoReturn

from engine.decoding.runtime import LookaheadUnsupportedError, PromptTooLongError
from engine.decoding.text import TemplateRenderError
from engine.llama.native import NativeError
from engine.llama.problems import ModelFileError, SettingsError
from engine.tools import serve
from engine.tools.commands import bench, chat, generate, shape, tune
from engine.tools.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    CliError,
    add_model_args,
    open_engine,
    prepare_auto,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        raise CliError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="Lookahead Chat decoding engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    generate.add_parser(sub)
    bench.add_parser(sub)
    tune.add_parser(sub)
    chat.add_parser(sub)
    shape.add_parser(sub)
    serve.add_parser(sub, add_model_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # The modules loaded by now live as long as the process: kept out of the cyclic collector's full passes,
    # which would otherwise walk all of them in the middle of a reply, a pause as long as a step every few hundred
    # steps (docs/SPEED.md, "The figures behind the code's constants").
    gc.freeze()
    try:
        args = parser.parse_args(argv)
        handler = {"generate": generate.cmd_generate, "bench": bench.cmd_bench, "chat": chat.cmd_chat,
                   "tune": tune.cmd_tune, "shape": shape.cmd_shape,
                   "serve": lambda a: serve.cmd_serve(a, open_engine, prepare_auto)}[args.command]
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
