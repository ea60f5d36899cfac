"""Plain against lookahead on the same prompts, in the same process.

Each prompt runs as a chat message through both decoders, alternating which
goes first so drift in the machine's speed does not favour either. Speed is
the ratio of the two in this run; absolute rates are context only.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .runtime import Engine, GenerationControls, GenerationSummary
from .settings import LookaheadConfig, StopConfig
from .text import Message

WORKLOADS_PATH = Path(__file__).with_name("data") / "workloads.jsonl"


@dataclass(frozen=True)
class Workload:
    id: str
    cat: str
    prompt: str


def load_workloads(path: str | Path | None = None) -> list[Workload]:
    """Read a JSONL file of {"id", "cat", "prompt"} (the repo's own by default)."""
    p = Path(path) if path else WORKLOADS_PATH
    out: list[Workload] = []
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                out.append(Workload(id=str(obj["id"]), cat=str(obj["cat"]), prompt=str(obj["prompt"])))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{p}:{n}: not a workload line ({exc})") from exc
    if not out:
        raise ValueError(f"{p}: no prompts")
    return out


def geomean(values: Iterable[float]) -> float:
    vals = [v for v in values if v > 0]
    if not vals:
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass
class Divergence:
    index: int
    plain_token: int
    lookahead_token: int
    plain_top2_gap: float | None
    plain_piece: str
    lookahead_piece: str


def first_divergence(engine: Engine, plain: GenerationSummary, other: GenerationSummary) -> Divergence | None:
    """Where two runs first differ, with the plain decoder's top-2 logit gap there."""
    a, b = plain.token_ids, other.token_ids
    for i in range(max(len(a), len(b))):
        ta = a[i] if i < len(a) else -1
        tb = b[i] if i < len(b) else -1
        if ta != tb:
            gap = plain.top2_gaps[i] if i < len(plain.top2_gaps) else None
            return Divergence(
                index=i,
                plain_token=ta,
                lookahead_token=tb,
                plain_top2_gap=gap,
                plain_piece=engine.detokenize([ta]) if ta >= 0 else "",
                lookahead_piece=engine.detokenize([tb]) if tb >= 0 else "",
            )
    return None


@dataclass
class PromptResult:
    id: str
    cat: str
    n_tokens: int
    plain_tps: float
    lookahead_tps: float
    speedup: float
    tokens_per_step: float
    identical: bool
    first_divergence: dict | None
    plain_s: float = 0.0
    lookahead_s: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass
class BenchReport:
    results: list[PromptResult]
    model: str
    lookahead: dict
    threads: int
    max_tokens: int

    def summary(self) -> dict:
        cats: dict[str, list[float]] = {}
        for r in self.results:
            cats.setdefault(r.cat, []).append(r.speedup)
        return {
            "by_cat": {c: round(geomean(v), 4) for c, v in cats.items()},
            "geomean": round(geomean(r.speedup for r in self.results), 4),
            "identical": sum(r.identical for r in self.results),
            "n": len(self.results),
            "tokens_per_step": round(sum(r.tokens_per_step for r in self.results) / max(len(self.results), 1), 3),
            "min_speedup": round(min((r.speedup for r in self.results), default=0.0), 4),
        }

    def to_json(self) -> dict:
        return {
            "results": [asdict(r) for r in self.results],
            "summary": self.summary(),
            "model": self.model,
            "lookahead": self.lookahead,
            "threads": self.threads,
            "max_tokens": self.max_tokens,
        }

    def table(self) -> str:
        lines = [f"{'id':<18} {'cat':<7} {'tok':>4} {'plain t/s':>9} {'la t/s':>8} {'speedup':>7} {'tok/step':>8} same"]
        for r in self.results:
            lines.append(
                f"{r.id:<18} {r.cat:<7} {r.n_tokens:>4} {r.plain_tps:>9.1f} {r.lookahead_tps:>8.1f} "
                f"{r.speedup:>7.3f} {r.tokens_per_step:>8.2f} {'yes' if r.identical else 'NO'}"
            )
        s = self.summary()
        lines.append("")
        lines.append("by category (geomean speedup): " + ", ".join(f"{c} {v:.3f}" for c, v in s["by_cat"].items()))
        lines.append(
            f"geomean {s['geomean']:.3f}  min {s['min_speedup']:.3f}  identical {s['identical']}/{s['n']}  "
            f"mean tokens/step {s['tokens_per_step']:.2f}"
        )
        return "\n".join(lines)


def run_one(engine: Engine, prompt: Sequence[int], lookahead: LookaheadConfig | None, max_tokens: int) -> GenerationSummary:
    """One generation from an empty cache."""
    engine.reset()
    summary = GenerationSummary()
    for ev in engine.generate(prompt, GenerationControls(lookahead=lookahead), stop=StopConfig(max_tokens=max_tokens)):
        summary.observe(ev)
    return summary


def run_bench(
    engine: Engine,
    workloads: Sequence[Workload],
    lookahead: LookaheadConfig,
    max_tokens: int = 128,
    on_result: Callable[[PromptResult], None] | None = None,
    cancel: threading.Event | None = None,
) -> BenchReport:
    results: list[PromptResult] = []
    for k, w in enumerate(workloads):
        if cancel is not None and cancel.is_set():
            break
        prompt = engine.render_chat([Message("user", w.prompt)])
        if k % 2 == 0:
            plain = run_one(engine, prompt, None, max_tokens)
            la = run_one(engine, prompt, lookahead, max_tokens)
        else:
            la = run_one(engine, prompt, lookahead, max_tokens)
            plain = run_one(engine, prompt, None, max_tokens)
        div = first_divergence(engine, plain, la)
        res = PromptResult(
            id=w.id,
            cat=w.cat,
            n_tokens=la.n_tokens,
            plain_tps=round(plain.tokens_per_s, 2),
            lookahead_tps=round(la.tokens_per_s, 2),
            speedup=round(plain.decode_s / la.decode_s * la.n_tokens / max(plain.n_tokens, 1), 4) if la.decode_s > 0 else 0.0,
            tokens_per_step=round(la.tokens_per_step, 3),
            identical=div is None,
            first_divergence=asdict(div) if div else None,
            plain_s=round(plain.decode_s, 4),
            lookahead_s=round(la.decode_s, 4),
        )
        results.append(res)
        if on_result:
            on_result(res)
    return BenchReport(
        results=results,
        model=engine.summary.path,
        lookahead=asdict(lookahead),
        threads=engine.n_threads,
        max_tokens=max_tokens,
    )


def parse_grid(spec: str) -> list[LookaheadConfig]:
    """``"W=0,1,2;N=2,3;G=0,2"`` -> every valid combination (W=G=0 is plain and left out)."""
    axes: dict[str, list[int]] = {"W": [0], "N": [3], "G": [0]}
    for part in spec.split(";"):
        if not part.strip():
            continue
        name, _, values = part.partition("=")
        name = name.strip().upper()
        if name not in axes or not values:
            raise ValueError(f"bad grid axis {part!r}: use W=..;N=..;G=..")
        axes[name] = [int(v) for v in values.split(",")]
    out = []
    for w in axes["W"]:
        for n in axes["N"]:
            for g in axes["G"]:
                if w == 0 and g == 0:
                    continue
                out.append(LookaheadConfig(window=w, ngram=n, guesses=g).validate())
    return out


@dataclass
class GridRow:
    window: int
    ngram: int
    guesses: int
    geomean: float
    by_cat: dict
    tokens_per_step: float
    identical: int
    n: int


def run_grid(
    engine: Engine,
    workloads: Sequence[Workload],
    configs: Sequence[LookaheadConfig],
    max_tokens: int = 96,
    on_prompt: Callable[[str], None] | None = None,
) -> list[GridRow]:
    """Every config on every prompt; each prompt's plain time is the mean of a run before and after."""
    per_cfg: dict[int, list[tuple[str, float, float, bool]]] = {i: [] for i in range(len(configs))}
    for w in workloads:
        prompt = engine.render_chat([Message("user", w.prompt)])
        before = run_one(engine, prompt, None, max_tokens)
        runs = [run_one(engine, prompt, cfg, max_tokens) for cfg in configs]
        after = run_one(engine, prompt, None, max_tokens)
        plain_tps = (before.tokens_per_s + after.tokens_per_s) / 2
        for i, la in enumerate(runs):
            per_cfg[i].append((w.cat, la.tokens_per_s / plain_tps, la.tokens_per_step, la.token_ids == before.token_ids))
        if on_prompt:
            on_prompt(w.id)
    rows = []
    for i, cfg in enumerate(configs):
        vals = per_cfg[i]
        cats: dict[str, list[float]] = {}
        for cat, sp, _, _ in vals:
            cats.setdefault(cat, []).append(sp)
        rows.append(
            GridRow(
                window=cfg.window,
                ngram=cfg.ngram,
                guesses=cfg.guesses,
                geomean=round(geomean(v[1] for v in vals), 4),
                by_cat={c: round(geomean(v), 4) for c, v in cats.items()},
                tokens_per_step=round(sum(v[2] for v in vals) / max(len(vals), 1), 3),
                identical=sum(v[3] for v in vals),
                n=len(vals),
            )
        )
    return rows
