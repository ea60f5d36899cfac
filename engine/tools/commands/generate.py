"""``python -m engine generate``: text for one prompt, streamed or as one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.decoding.runtime import GenerationControls
from engine.decoding.session import ChatSession
from engine.decoding.settings import StopConfig
from engine.decoding.text import Message, conversation_messages
from engine.speed.run_stats import RunStats
from engine.tools.commands.common import (
    CliError,
    add_lookahead_args,
    add_model_args,
    add_sampling_args,
    attach_to,
    lookahead_from_args,
    open_engine,
    read_attachments,
    sampling_from_args,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``generate`` and its options to the command line's subcommands ``sub``."""
    g = sub.add_parser("generate", help="generate text for one prompt")
    add_model_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    g.add_argument("--chat", action="store_true", help="send the prompt as a user message with the chat template")
    g.add_argument("--system", default="", help="system prompt (with --chat)")
    add_lookahead_args(g)
    g.add_argument("--max-tokens", type=int, default=256)
    add_sampling_args(g)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the reply before this text (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    g.add_argument("--attach", action="append", default=[], metavar="FILE",
                   help="attach a file to the prompt (repeatable): text, Markdown, code, CSV, JSON, HTML, PDF or "
                        "DOCX; whole if it fits, else its passages that best match the prompt; drafts use all of it")


def cmd_generate(args: argparse.Namespace) -> int:
    """``engine generate``: read the prompt and options, open the model, write the reply as it comes. Kept in
    one piece: each option is read once, in the order the help lists them."""
    if args.prompt_file:
        try:
            prompt_text = Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read prompt file {args.prompt_file}: {exc}") from exc
    else:
        prompt_text = args.prompt
    lookahead = lookahead_from_args(args)
    sampling = sampling_from_args(args)
    stop = StopConfig(max_tokens=args.max_tokens, stop_strings=tuple(args.stop), loop_guard=args.loop_guard).validate()
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
                        **summary.to_json(),
                        "token_sources": token_sources,
                        "mode": "plain" if lookahead is None else ("auto" if lookahead.auto else "lookahead"),
                        "window": lookahead.window if lookahead else 0,
                        "ngram": lookahead.ngram if lookahead else 0,
                        "guesses": lookahead.guesses if lookahead else 0,
                        "last_step_shape": {"window": w, "ngram": n, "guesses": g},
                        "documents": {} if context is None else {
                            "whole": context.whole, "seen": context.coverage,
                            "citations": [{"name": c.name, "where": c.where} for c in context.citations]},
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
