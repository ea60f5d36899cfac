"""Plain against lookahead on the same prompts, in the same process.

Each prompt runs as a chat message through both decoders, in A-B-B-A blocks
whose first mode alternates, so drift in the machine's speed does not favour
either; each mode is timed by its fastest run. Speed is the ratio of the two
in this run; absolute rates are context only.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .costmodel import CostCurve
from .runtime import Engine, GenerationControls, GenerationSummary
from .settings import LookaheadConfig, StopConfig
from .text import Message

WORKLOADS_PATH = Path(__file__).with_name("data") / "workloads.jsonl"
MIN_TIMED_TOKENS = 512  # per mode and prompt
MAX_RUNS = 8


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
        oracle: dict[str, list[float]] = {}
        for r in self.results:
            cats.setdefault(r.cat, []).append(r.speedup)
            if "oracle_bound" in r.extra:
                oracle.setdefault(r.cat, []).append(r.extra["oracle_bound"])
        return {
            "oracle_by_cat": {c: round(geomean(v), 4) for c, v in oracle.items()},
            "oracle_geomean": round(geomean(v for vs in oracle.values() for v in vs), 4),
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
        lines = [
            f"{'id':<18} {'cat':<7} {'tok':>4} {'plain t/s':>9} {'la t/s':>8} {'speedup':>7} "
            f"{'tok/step':>8} {'oracle':>6} same"
        ]
        for r in self.results:
            oracle = r.extra.get("oracle_bound")
            lines.append(
                f"{r.id:<18} {r.cat:<7} {r.n_tokens:>4} {r.plain_tps:>9.1f} {r.lookahead_tps:>8.1f} "
                f"{r.speedup:>7.3f} {r.tokens_per_step:>8.2f} {oracle if oracle is not None else 0:>6.3f} "
                f"{'yes' if r.identical else 'NO'}"
            )
        s = self.summary()
        lines.append("")
        lines.append("by category (geomean speedup): " + ", ".join(f"{c} {v:.3f}" for c, v in s["by_cat"].items()))
        lines.append("oracle bound by category:      " + ", ".join(f"{c} {v:.3f}" for c, v in s["oracle_by_cat"].items()))
        lines.append(
            f"geomean {s['geomean']:.3f} (oracle {s['oracle_geomean']:.3f})  min {s['min_speedup']:.3f}  "
            f"identical {s['identical']}/{s['n']}  mean tokens/step {s['tokens_per_step']:.2f}"
        )
        return "\n".join(lines)


def run_one(
    engine: Engine,
    prompt: Sequence[int],
    lookahead: LookaheadConfig | None,
    max_tokens: int,
    record_gaps: bool = False,
    exact_only: bool = True,
) -> GenerationSummary:
    """One generation from an empty cache."""
    engine.reset()
    summary = GenerationSummary()
    events = engine.generate(
        prompt,
        GenerationControls(lookahead=lookahead),
        stop=StopConfig(max_tokens=max_tokens),
        record_gaps=record_gaps,
        exact_only=exact_only,
    )
    for ev in events:
        summary.observe(ev)
    return summary


def run_bench(
    engine: Engine,
    workloads: Sequence[Workload],
    lookahead: LookaheadConfig,
    max_tokens: int = 128,
    on_result: Callable[[PromptResult], None] | None = None,
    cancel: threading.Event | None = None,
    null: bool = False,
) -> BenchReport:
    """Plain against ``lookahead`` on every workload.

    ``null`` runs plain in both places instead, on the same schedule: the
    "speedups" it reports are this machine's timing noise.
    """
    results: list[PromptResult] = []
    second_mode = None if null else lookahead
    if workloads:  # warm-up: page in the weights before anything is timed
        run_one(engine, engine.render_chat([Message("user", workloads[0].prompt)]), None, 16)
    for k, w in enumerate(workloads):
        if cancel is not None and cancel.is_set():
            break
        prompt = engine.render_chat([Message("user", w.prompt)])
        # A-B-B-A blocks (first mode alternating per prompt): drift in the
        # machine's speed hits both modes alike. A short reply gets more blocks,
        # so each mode is timed over at least MIN_TIMED_TOKENS tokens. Each mode
        # is timed by its fastest run: other load on the machine only ever adds time.
        block = (False, True, True, False) if k % 2 == 0 else (True, False, False, True)  # lookahead's turn?
        outputs: dict[bool, list[GenerationSummary]] = {False: [], True: []}
        while True:
            for is_la in block:
                outputs[is_la].append(run_one(engine, prompt, second_mode if is_la else None, max_tokens))
            runs = len(outputs[False])
            if runs * max(outputs[False][0].n_tokens, 1) >= MIN_TIMED_TOKENS or runs >= MAX_RUNS:
                break
        plain, la = outputs[False][0], outputs[True][0]
        same = all(o.token_ids == plain.token_ids for o in outputs[False] + outputs[True])
        plain_s = min(o.decode_s for o in outputs[False])
        la_s = min(o.decode_s for o in outputs[True])
        div = first_divergence(engine, plain, la)
        if div is not None:
            # The timed run skips the top-2 bookkeeping; an untimed one supplies the gap.
            gapped = run_one(engine, prompt, None, max_tokens, record_gaps=True)
            div = first_divergence(engine, gapped, la)
        res = PromptResult(
            id=w.id,
            cat=w.cat,
            n_tokens=la.n_tokens,
            plain_tps=round(plain.n_tokens / plain_s, 2) if plain_s > 0 else 0.0,
            lookahead_tps=round(la.n_tokens / la_s, 2) if la_s > 0 else 0.0,
            speedup=round((plain_s / la_s) * (la.n_tokens / max(plain.n_tokens, 1)), 4) if la_s > 0 else 0.0,
            tokens_per_step=round(la.tokens_per_step, 3),
            identical=div is None and same,
            first_divergence=asdict(div) if div else None,
            plain_s=round(plain_s, 4),
            lookahead_s=round(la_s, 4),
        )
        res.extra["oracle_bound"] = round(oracle_bound(prompt, plain.token_ids, engine.cost_curve), 4)
        res.extra["runs"] = runs
        res.extra["drafted"] = la.n_drafted
        res.extra["accepted"] = la.n_accepted
        # Rate after the first token, the way the llama-cpp-python reference is timed.
        rest = plain.elapsed_s - (plain.first_token_s or 0.0)
        res.extra["plain_tps_after_first"] = round((plain.n_tokens - 1) / rest, 2) if rest > 0 else 0.0
        results.append(res)
        if on_result:
            on_result(res)
    return BenchReport(
        results=results,
        model=engine.summary.path,
        lookahead={"null": True} if null else asdict(lookahead),
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


def oracle_bound(context: Sequence[int], output: Sequence[int], curve: CostCurve, max_draft: int = 16) -> float:
    """Speedup of an oracle that drafts, from the prompt and history only, exactly what will be accepted.

    At each step the oracle may verify any prefix of the longest earlier
    continuation of the last committed token that equals the true output, and
    picks the step lengths that minimise total cost (the cost curve prices
    each step). Plain decoding costs ``cost(1)`` per token.
    """
    seq = list(context)
    out = list(output)
    n = len(out)
    if n == 0:
        return 1.0
    positions: dict[int, list[int]] = {}
    for j, t in enumerate(seq[:-1]):
        positions.setdefault(t, []).append(j)
    reach = [0] * n  # drafts that would land when output[i] is next
    for i in range(n):
        last = seq[-1]
        best = 0
        for j in positions.get(last, ()):
            k = 0
            while k < max_draft and i + k < n and j + 1 + k < len(seq) and seq[j + 1 + k] == out[i + k]:
                k += 1
            best = max(best, k)
        reach[i] = best
        positions.setdefault(last, []).append(len(seq) - 1)
        seq.append(out[i])
    cost = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        cost[i] = min(curve.cost(1 + a) + cost[min(n, i + 1 + a)] for a in range(0, min(reach[i], n - 1 - i) + 1))
    return n * curve.cost(1) / cost[0]


def perfect_draft_bound(curve: CostCurve, max_len: int = 64) -> float:
    """Speedup if every step's drafts were all accepted, at the best step length."""
    return max(k / curve.cost(k) for k in range(1, max_len + 1))


def llama_cpp_tps(model_path: str, prompts: Sequence[Sequence[int]], max_tokens: int, threads: int) -> list[float]:
    """Greedy decoding speed of llama-cpp-python's own ``Llama`` on the same prompt tokens (reference)."""
    import time

    from llama_cpp import Llama

    llm = Llama(model_path=str(model_path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        rates = []
        for prompt in prompts:
            t_first = t_last = 0.0
            n = 0
            for tok in llm.generate(list(prompt), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
                now = time.perf_counter()
                if n == 0:
                    t_first = now
                t_last = now
                n += 1
                if llm._model.token_is_eog(tok) if hasattr(llm._model, "token_is_eog") else tok == llm.token_eos():
                    break
                if n >= max_tokens:
                    break
            rates.append((n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else 0.0)
        return rates
    finally:
        llm.close()
