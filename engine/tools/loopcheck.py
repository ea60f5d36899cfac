"""How the loop guard does on real replies: which replies loop, which it stops, and whether it stops copying.

    python -m engine.tools.loopcheck [--model F] [--prompts F] [--max-tokens 256] [--no-guard-context]
                                     [the sampler options of engine generate: --repeat-penalty 1.1, --dry 0.8, ...]

Each prompt of ``engine/data/loop-prompts.jsonl`` is sent as a chat message with the app's system prompt and
answered with the sampler asked for (the app's by default) by plain decoding with the guard off, so that the whole
reply is seen. Two judges read it: the
guard (engine/decoding/loops.py), run over the reply's tokens as it would have run while decoding, and a reader's
rule on the text that does not share the guard's method (a 6-word run that comes 4 or more times, or one word or
character over and over). A prompt with a ``copy`` field also has that answer, a correct one that copies the
prompt, run through the guard: it must not be stopped. ``--no-guard-context`` runs the guard without the prompt, to
show what knowing the prompt spares. What a reply must keep to be right is checked too: a prompt's ``copy`` answer
standing in the reply (spaces and backquotes aside), and each of its ``must`` strings (a renamed identifier, a
kept line).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.decoding.loops import LoopGuard, reads_as_a_loop
from engine.decoding.opening import ModelOpener
from engine.decoding.runtime import GenerationControls
from engine.decoding.session import ChatSession
from engine.decoding.settings import StopConfig
from engine.decoding.text import conversation_messages
from engine.tools.commands.common import add_sampling_args, sampling_from_args

PROMPTS = Path(__file__).resolve().parents[1] / "data" / "loop-prompts.jsonl"
SYSTEM_PROMPT = "You are a helpful assistant."  # the app's default


def guard_stop(context: Sequence[int], reply: Sequence[int], piece: Callable[[int], bytes]) -> int | None:
    """The index of the token with which the guard would have stopped ``reply``, or None."""
    guard = LoopGuard(context, piece=piece)
    return next((i for i, token in enumerate(reply) if guard.push(token)), None)


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", "")).strip().lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.loopcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="GGUF model file (default: the bundled one)")
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-guard-context", action="store_true", help="run the guard without the prompt")
    add_sampling_args(parser)  # its --loop-guard is not used: the guard is judged beside every whole reply
    args = parser.parse_args(argv)
    sampling = sampling_from_args(args)
    print(f"settings: {sampling.describe()}, {args.max_tokens} tokens at most", flush=True)
    prompts = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line]
    engine = ModelOpener().open(args.model, 4096, args.threads).engine
    session = ChatSession(engine)
    counts: Counter[str] = Counter()
    for p in prompts:
        messages = conversation_messages(SYSTEM_PROMPT, user_text=p["prompt"])
        context = [] if args.no_guard_context else session.fit(messages, args.max_tokens).tokens
        reply: list[int] = []
        text = []
        for ev in session.reply(messages, controls=GenerationControls(lookahead=None), sampling=sampling,
                                stop=StopConfig(max_tokens=args.max_tokens)):
            reply.extend(ev.token_ids)
            text.append(ev.text)
        whole = "".join(text)
        loops, stop = reads_as_a_loop(whole), guard_stop(context, reply, engine.model.token_bytes)
        counts["replies"] += 1
        counts["read as loops"] += loops
        counts["stopped"] += stop is not None
        counts["stopped, read as loops"] += loops and stop is not None
        counts["loops not stopped"] += loops and stop is None
        verdict = f"stopped at token {stop}" if stop is not None else "not stopped"
        line = f"{p['id']:<18} {len(reply):>4} tokens  {'loops' if loops else 'no loop':<8} {verdict}"
        if "copy" in p:
            copied = engine.tokenize(p["copy"], add_special=False)
            copy_stop = guard_stop(context, copied, engine.model.token_bytes)
            counts["correct copies"] += 1
            counts["correct copies stopped"] += copy_stop is not None
            line += f"  | correct copy ({len(copied)} tokens): " + ("STOPPED" if copy_stop is not None else "kept")
            counts["replies that copy the answer"] += _plain(p["copy"]) in _plain(whole)
        kept = [m for m in p.get("must", ()) if m.lower() in whole.lower()]
        counts["must-keep strings"] += len(p.get("must", ()))
        counts["must-keep strings kept"] += len(kept)
        print(line, flush=True)
    print(" · ".join(f"{name} {n}" for name, n in counts.items()))
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
