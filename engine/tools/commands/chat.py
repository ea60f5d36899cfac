"""``python -m engine chat``: chat in the terminal."""

from __future__ import annotations

import argparse
import sys

from engine.decoding.runtime import GenerationControls, PromptTooLongError
from engine.decoding.session import ChatSession
from engine.decoding.settings import SamplingConfig, StopConfig
from engine.decoding.text import Message, conversation_messages
from engine.speed.run_stats import RunStats
from engine.tools.commands.common import (
    add_lookahead_args,
    add_model_args,
    attach_to,
    lookahead_from_args,
    open_engine,
    read_attachments,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``chat`` and its options to the command line's subcommands ``sub``."""
    c = sub.add_parser("chat", help="chat in the terminal")
    add_model_args(c)
    add_lookahead_args(c)
    c.add_argument("--system", default="")
    c.add_argument("--max-tokens", type=int, default=512)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--attach", action="append", default=[], metavar="FILE",
                   help="attach a file to the chat (repeatable): given with the first message, drafted from throughout")


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
