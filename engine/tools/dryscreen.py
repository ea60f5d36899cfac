"""How often a draft token lands, by the penalty DRY would give it: what ``DRY_CUT`` (engine/decoding/dry.py) is
chosen from.

    python -m engine.tools.dryscreen [--model F] [--prompts F] [--max-tokens 256] [the sampler options of
                                      engine generate; DRY 0.8 is the app's default]

Each prompt is answered by plain decoding with the sampler asked for; then the reply is replayed token by token
through the draft sources a generation has (the prompt's and the reply's suffix matches, the n-gram pool) with
nothing cut, and each draft token, while the tokens before it were right, is counted by the penalty DRY would give
it there and whether the reply has it. Draft tokens past a penalty that lands seldom are batch rows lost.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.decoding.drafts import DraftSources, HistoryIndex
from engine.decoding.dry import dry_screen
from engine.decoding.opening import ModelOpener
from engine.decoding.origins import DraftOrigin
from engine.decoding.pool import NgramPool
from engine.decoding.runtime import GenerationControls
from engine.decoding.settings import MAX_NGRAM, SamplingConfig, StopConfig
from engine.decoding.text import Message
from engine.tools.commands.common import add_sampling_args, sampling_from_args

PROMPTS = Path(__file__).resolve().parents[1] / "data" / "loop-prompts.jsonl"
EDGES = (0.0, 0.8, 1.4, 2.45, 4.3)  # DRY 0.8's penalties for 2 to 5 tokens of repeat; above: 6 or more
DRAFTS, DRAFT_LENGTH = 3, 8

# (origin, penalty bucket) -> [draft tokens tested, landed]
Tally = dict[tuple[str, float], list[int]]


def bucket(penalty: float) -> float:
    """The smallest edge at or above ``penalty`` (``inf`` past the last)."""
    return next((edge for edge in EDGES if penalty <= edge + 1e-6), float("inf"))


def replay(prompt: Sequence[int], reply: Sequence[int], is_breaker: Callable[[int], bool], sampling: SamplingConfig,
           tally: Tally) -> None:
    """Count the drafts each position of ``reply`` would have been offered into ``tally``."""
    history, pool = HistoryIndex(), NgramPool(max_len=MAX_NGRAM - 1)
    history.extend(prompt, DraftOrigin.PROMPT)
    pool.add_tokens(prompt, origin=DraftOrigin.PROMPT)
    screen = dry_screen(sampling, prompt, is_breaker, threshold=math.inf)
    assert screen is not None, "DRY is off"
    sources = DraftSources(history, pool)
    text = [*prompt, *reply]
    for i in range(len(reply)):
        for draft in sources.rank(text[len(prompt) + i - 1], DRAFTS, DRAFT_LENGTH):
            for k, penalty in enumerate(screen.penalties(draft.tokens)):
                if i + k >= len(reply):
                    break
                counts = tally.setdefault((draft.origin, bucket(penalty)), [0, 0])
                counts[0] += 1
                counts[1] += draft.tokens[k] == reply[i + k]
                if draft.tokens[k] != reply[i + k]:
                    break
        history.extend([reply[i]], DraftOrigin.REPLY)
        screen.extend([reply[i]])
        start = len(prompt) + i - pool.max_len - 1  # an n-gram's continuation is complete (as Generation's pool)
        if start >= 0:
            pool.add(text[start], text[start + 1 : start + 1 + pool.max_len], DraftOrigin.REPLY)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.dryscreen", description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="GGUF model file (default: the bundled one)")
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    add_sampling_args(parser)
    args = parser.parse_args(argv)
    sampling = sampling_from_args(args)
    if not sampling.dry:
        parser.error("DRY is off: give --dry")
    print(f"settings: {sampling.describe()}, {args.max_tokens} tokens at most", flush=True)
    prompts = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line]
    engine = ModelOpener().open(args.model, 4096, args.threads).engine
    tally: Tally = {}
    for p in prompts:
        prompt = engine.render_chat([Message("user", p["prompt"])])
        engine.reset()
        reply = [t for ev in engine.generate(prompt, GenerationControls(lookahead=None), sampling=sampling,
                                             stop=StopConfig(max_tokens=args.max_tokens)) for t in ev.token_ids]
        replay(prompt, reply, engine.model.is_dry_breaker, sampling, tally)
    engine.close()
    for (origin, edge), (tested, hits) in sorted(tally.items()):
        label = f"{edge:g}" if edge != float("inf") else f"> {EDGES[-1]:g}"
        print(f"{origin:<12} penalty {label:>6}: {tested:>6} draft tokens tested, {hits / tested:.0%} landed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
