"""What the commands of ``python -m engine`` share: the one-line error and exit codes, the model, lookahead and
sampler options, opening the engine, Auto's curve for benchmarks, and attached files."""

from __future__ import annotations

import argparse
import sys

from engine.costs.calibration import MachineBusy
from engine.decoding.attaching import attach_documents
from engine.decoding.opening import ModelOpener
from engine.decoding.runtime import Engine
from engine.decoding.session import ChatSession
from engine.decoding.settings import APP_LOOP_GUARD, APP_SAMPLING, DEFAULT_LOOKAHEAD, LookaheadConfig, SamplingConfig
from engine.decoding.text import Message
from engine.documents import Document, DocumentContext, DocumentError, read_document
from engine.llama.problems import SettingsError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


class CliError(Exception):
    """A user-facing error: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF model file (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads, kept as given (default: one per physical performance core, at most 8, "
                        "one fewer while another program keeps a core busy)")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")


def add_lookahead_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["plain", "lookahead", "auto"], default=None,
                   help="default: lookahead with Auto sizing (plain when the model cannot do lookahead)")
    p.add_argument("--window", type=int, default=None, help="lookahead window W (0..16)")
    p.add_argument("--ngram", type=int, default=None, help="n-gram size N (2..8)")
    p.add_argument("--guesses", type=int, default=None, help="verification candidates G (0..16)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampler and the loop guard, defaulting to the app's (``APP_SAMPLING``, ``APP_LOOP_GUARD``)."""
    d = APP_SAMPLING
    p.add_argument("--temperature", type=float, default=d.temperature, help=f"0 = greedy (default {d.temperature:g})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the sampled draws (default {d.seed})")
    p.add_argument("--top-k", type=int, default=d.top_k,
                   help=f"sample from the k likeliest tokens (0 = all; default {d.top_k})")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"nucleus sampling threshold (default {d.top_p:g})")
    p.add_argument("--min-p", type=float, default=d.min_p,
                   help=f"drop tokens below this fraction of the likeliest one's probability (default {d.min_p:g})")
    p.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty,
                   help=f"penalise tokens seen in the last --repeat-last-n tokens, also when greedy (1 = off; 1..2; "
                        f"default {d.repeat_penalty:g})")
    p.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n,
                   help=f"how many recent tokens the penalty looks at (0 = off; default {d.repeat_last_n})")
    p.add_argument("--dry", type=float, default=d.dry_multiplier, metavar="MULTIPLIER",
                   help=f"DRY: penalise a token that extends a repeat of an earlier span (0 = off; 0.8 is "
                        f"llama.cpp's usual value; default {d.dry_multiplier:g})")
    p.add_argument("--dry-base", type=float, default=d.dry_base,
                   help=f"DRY's growth per token (default {d.dry_base:g})")
    p.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length,
                   help=f"DRY: a repeat this long is free (default {d.dry_allowed_length})")
    p.add_argument("--dry-prompt-tokens", type=int, default=d.dry_last_n,
                   help=f"DRY also sees this many of the prompt's last tokens (0 = the reply only; "
                        f"default {d.dry_last_n})")
    p.add_argument("--loop-guard", action=argparse.BooleanOptionalAction, default=APP_LOOP_GUARD,
                   help=f"stop a reply that repeats one passage over and over, as the app does "
                        f"(default: {'on' if APP_LOOP_GUARD else 'off'})")


def sampling_from_args(args: argparse.Namespace) -> SamplingConfig:
    try:
        return SamplingConfig(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
            repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n, dry_multiplier=args.dry,
            dry_base=args.dry_base, dry_allowed_length=args.dry_allowed_length, dry_last_n=args.dry_prompt_tokens,
        ).validate()
    except SettingsError as exc:
        raise CliError(str(exc)) from None


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
    """The engine for ``--model``/``--ctx``/``--threads``, opened as the app opens one (``ModelOpener``): a file
    opened for the first time is test-loaded in a child process first, so damage that would crash llama.cpp ends
    as one error line."""
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    return ModelOpener().open(args.model, args.ctx, args.threads).engine


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
    placed, context = attach_documents(session, messages, docs, max_tokens)
    messages[-1] = placed[-1]
    eng.set_documents([d.text for d in docs])
    seen = ", ".join(f"{name} {fraction:.0%}" for name, fraction in context.coverage.items())
    print(f"note: attached ({'whole' if context.whole else 'best passages'}): {seen}", file=sys.stderr)
    return context
