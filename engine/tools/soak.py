"""Soak test: many generations on one engine, checking the cache after every step and watching memory.

    python -m engine.tools.soak --generations 200

Generations cycle through plain, fixed lookahead and Auto; fixed ones change W/N/G half-way
through, some are stopped early, and every fifth starts from an empty cache (the others reuse
what the cache holds, as a chat does). After every step the KV cache must hold exactly the
committed tokens: every sequence spans positions 0..n-1. Resident memory (RSS) is read after a
warm-up and at the end; the run fails if it grew by more than ``--max-growth`` percent.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from engine.decoding.opening import ModelOpener
from engine.decoding.runtime import Engine, GenerationControls
from engine.decoding.settings import LookaheadConfig, StopConfig
from engine.decoding.text import Message
from engine.llama.problems import ModelFileError, SettingsError
from engine.speed.workloads import load_workloads

# Fixed shapes visited in turn; each generation switches to the next one half-way through.
FIXED_SHAPES = (
    LookaheadConfig(window=0, ngram=3, guesses=1),
    LookaheadConfig(window=2, ngram=3, guesses=2),
    LookaheadConfig(window=0, ngram=5, guesses=4),
    LookaheadConfig(window=1, ngram=4, guesses=3),
    LookaheadConfig(window=4, ngram=4, guesses=0),
    LookaheadConfig(window=3, ngram=2, guesses=2),
)
AUTO = LookaheadConfig(auto=True, window=4, ngram=8, guesses=2)
MODES = ("plain", "lookahead", "auto")
MAX_RSS_GROWTH_PCT = 5.0


def rss_bytes() -> int:
    """Current resident set size (VmRSS); the peak from getrusage where /proc is missing."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class SoakReport:
    """What a soak run did and found."""

    generations: int = 0
    steps: int = 0
    tokens: int = 0
    cancelled: int = 0
    by_mode: dict[str, int] = field(default_factory=dict)
    shapes_seen: int = 0  # distinct (W, N, G) that ran a step
    rss_start: int = 0  # after the warm-up
    rss_end: int = 0
    rss_peak: int = 0
    elapsed_s: float = 0.0
    cache_errors: list[str] = field(default_factory=list)

    @property
    def rss_growth_pct(self) -> float:
        return 100.0 * (self.rss_end - self.rss_start) / self.rss_start if self.rss_start else 0.0

    def ok(self, max_growth_pct: float = MAX_RSS_GROWTH_PCT) -> bool:
        return not self.cache_errors and self.rss_growth_pct < max_growth_pct

    def line(self) -> str:
        mib = 1 / 2**20
        return (
            f"{self.generations} generations, {self.steps} steps, {self.tokens} tokens in {self.elapsed_s:.1f} s "
            f"({', '.join(f'{k} {v}' for k, v in self.by_mode.items())}; {self.cancelled} stopped early; "
            f"{self.shapes_seen} step shapes); RSS {self.rss_start * mib:.1f} -> {self.rss_end * mib:.1f} MiB "
            f"({self.rss_growth_pct:+.2f}% after warm-up, peak {self.rss_peak * mib:.1f} MiB); "
            f"cache errors: {len(self.cache_errors)}"
        )

    def to_json(self) -> dict:
        out = asdict(self)
        out["rss_growth_pct"] = round(self.rss_growth_pct, 3)
        out["cache_errors"] = self.cache_errors[:20]
        return out


def cache_error(engine: Engine) -> str | None:
    """None if every sequence holds exactly positions 0..n-1 (the committed tokens); else what differs."""
    n = engine.kv.n
    want = (0, n - 1) if n else (-1, -1)
    wrong = {s: span for s, span in engine.cache_positions().items() if span != want}
    if not wrong:
        return None
    shown = ", ".join(f"seq {s}: {a}..{b}" for s, (a, b) in list(wrong.items())[:4])
    return f"{len(wrong)} sequence(s) differ from 0..{n - 1}: {shown}"


def run_soak(
    engine: Engine,
    generations: int,
    max_tokens: int = 48,
    warmup: int = 3,
    prompts: Sequence[str] | None = None,
    on_generation: Callable[[int, SoakReport], None] | None = None,
) -> SoakReport:
    """Run ``generations`` generations on ``engine``; the report says what went wrong, if anything."""
    if prompts is None:
        prompts = [w.prompt for w in load_workloads()]
    report = SoakReport()
    by_mode: Counter[str] = Counter()
    shapes: set[tuple[int, int, int]] = set()
    t0 = time.perf_counter()
    report.rss_start = rss_bytes()
    for g in range(generations):
        mode = MODES[g % len(MODES)]
        shape = FIXED_SHAPES[(g // len(MODES)) % len(FIXED_SHAPES)]
        then = FIXED_SHAPES[(g // len(MODES) + 1) % len(FIXED_SHAPES)]
        controls = GenerationControls(lookahead={"plain": None, "lookahead": shape, "auto": AUTO}[mode])
        if g % 5 == 0:
            engine.reset()
        prompt = engine.render_chat([Message("user", prompts[g % len(prompts)])])
        stop_at = max_tokens // 3 if g % 7 == 6 else None  # now and then the user presses Stop
        n_tokens = 0
        for step, ev in enumerate(engine.generate(prompt, controls, stop=StopConfig(max_tokens=max_tokens))):
            report.steps += 1
            n_tokens += len(ev.token_ids)
            if ev.mode != "none":
                shapes.add((ev.window, ev.ngram, ev.guesses))
            problem = cache_error(engine)
            if problem:
                report.cache_errors.append(f"generation {g} ({mode}) step {step}: {problem}")
            if mode == "lookahead" and step == 3:
                controls.lookahead = then  # W/N/G change mid-generation
            if stop_at is not None and n_tokens >= stop_at:
                controls.cancel.set()
            if ev.stop_reason == "cancelled":
                report.cancelled += 1
        report.tokens += n_tokens
        report.generations += 1
        by_mode[mode] += 1
        rss = rss_bytes()
        report.rss_peak = max(report.rss_peak, rss)
        if g + 1 == warmup:
            report.rss_start = rss  # after every mode has run once: buffers and caches are allocated
        report.rss_end = rss
        report.by_mode = dict(by_mode)
        report.shapes_seen = len(shapes)
        report.elapsed_s = time.perf_counter() - t0
        if on_generation is not None:
            on_generation(g, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--warmup", type=int, default=3, help="generations before the RSS baseline (default 3)")
    parser.add_argument("--model", help="GGUF model file (default: the bundled model)")
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-growth", type=float, default=MAX_RSS_GROWTH_PCT, help="allowed RSS growth, percent")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    if args.generations < 1 or args.max_tokens < 1 or args.warmup < 0:
        print("error: --generations and --max-tokens must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2

    def progress(g: int, report: SoakReport) -> None:
        if (g + 1) % 10 == 0 or report.cache_errors:
            print(f"[{g + 1}/{args.generations}] {report.line()}", file=sys.stderr)

    try:
        with ModelOpener().open(args.model, args.ctx, args.threads).engine as engine:
            report = run_soak(engine, args.generations, args.max_tokens, args.warmup, on_generation=progress)
    except (ModelFileError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json()) if args.json else report.line())
    for err in report.cache_errors[:10]:
        print(f"cache error: {err}", file=sys.stderr)
    if report.rss_growth_pct >= args.max_growth:
        print(f"error: RSS grew {report.rss_growth_pct:.2f}% (limit {args.max_growth}%)", file=sys.stderr)
    return 0 if report.ok(args.max_growth) else 1


if __name__ == "__main__":
    sys.exit(main())
