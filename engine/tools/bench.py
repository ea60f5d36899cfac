"""Plain against lookahead on the same prompts, in the same process.

Each prompt runs as a chat message through both decoders, measured as the
app's Compare tab measures (``engine.speed.comparison``): A-B-B-A pairs whose
first mode alternates from prompt to prompt, repeated until their speedups
agree, each mode represented by its median run. Speed is the ratio of the two
in this run, with the range of the pairs' ratios; absolute rates are context
only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from engine.costs.curve import CostCurve
from engine.decoding import kept as kept_ngrams
from engine.decoding.attaching import attach_documents
from engine.decoding.drafts import CorpusIndex
from engine.decoding.grammar import Constraint, follows
from engine.decoding.origins import DraftOrigin
from engine.decoding.replay import ReplayDrafts
from engine.decoding.runtime import Engine, GenerationControls
from engine.decoding.session import ChatSession
from engine.decoding.settings import APP_LOOP_GUARD, APP_SAMPLING, LookaheadConfig, SamplingConfig, StopConfig
from engine.decoding.text import Message
from engine.documents import DocumentContext, read_document
from engine.speed.comparison import compare_decoders, prompt_result
from engine.speed.rows import ALL, BenchFigures, CategoryRow, Loops, PromptResult, by_category
from engine.speed.run_stats import RunStats, first_divergence, geomean, simulated_speedup
from engine.speed.tables import console_table
from engine.speed.workloads import Workload


def _split_roll_up(results: Sequence[PromptResult]) -> tuple[list[CategoryRow], CategoryRow]:
    """``by_category`` as (the categories, the row over all of them)."""
    rows = by_category(results)
    if not rows:
        return [], CategoryRow(cat=ALL, n=0, speedup=0.0, tokens_per_step=0.0, identical=0)
    return rows[:-1], rows[-1]


@dataclass
class BenchReport:
    results: list[PromptResult]
    model: str
    lookahead: dict
    threads: int
    max_tokens: int
    simulated: bool = False  # speedups priced on a what-if curve (run_stats.simulated_speedup), not timed
    replay: float | None = None  # drafts replayed from plain's reply, right at this share of positions
    sampling: SamplingConfig = APP_SAMPLING
    loop_guard: bool = APP_LOOP_GUARD

    def summary(self) -> dict:
        cats, overall = _split_roll_up(self.results)
        by_source: dict[str, int] = {}
        for r in self.results:
            for source, n in r.accepted_by_source.items():
                by_source[source] = by_source.get(source, 0) + n
        figures = [r.bench for r in self.results if r.bench is not None]
        all_sources = [b.oracle_all_sources for b in figures if b.oracle_all_sources is not None]
        loops = Loops.of(self.results)
        tokens = sum(r.n_tokens for r in self.results)
        return {
            "simulated": self.simulated,
            "settings": self.sampling.describe(self.loop_guard),
            "looped": loops.looped,
            "stopped_by_guard": loops.stopped,
            "geomean_not_looped": round(loops.kept_speedup, 4),
            "min_not_looped": round(min((r.speedup for r in loops.kept), default=0.0), 4),
            "accepted_by_source": dict(sorted(by_source.items())),
            "oracle_prompt_history": round(overall.oracle_bound or 0.0, 4),
            "oracle_all_sources": round(geomean(all_sources), 4),
            "oracle_by_cat": {c.cat: round(c.oracle_bound, 4) for c in cats if c.oracle_bound is not None},
            "oracle_geomean": round(overall.oracle_bound or 0.0, 4),
            "by_cat": {c.cat: round(c.speedup, 4) for c in cats},
            "geomean": round(overall.speedup, 4),
            "identical": overall.identical,
            "n": overall.n,
            "tokens_per_step": round(overall.tokens_per_step, 3),
            "min_speedup": round(min((r.speedup for r in self.results), default=0.0), 4),
            "drafted_steps": sum(b.drafted_steps for b in figures),
            "landed_steps": sum(b.landed_steps for b in figures),
            "under_schema": sum(b.follows_schema is not None for b in figures),
            "follow_schema": sum(b.follows_schema is True for b in figures),
            "grammar_share": round(by_source.get(DraftOrigin.GRAMMAR, 0) / max(tokens, 1), 4),
        }

    def to_json(self) -> dict:
        return {
            "simulated": self.simulated,
            "results": [r.to_json() for r in self.results],
            "summary": self.summary(),
            "model": self.model,
            "lookahead": self.lookahead,
            "threads": self.threads,
            "max_tokens": self.max_tokens,
            "replay": self.replay,
            "sampling": asdict(self.sampling),
            "loop_guard": self.loop_guard,
        }

    def table(self) -> str:
        lines = console_table(self.results, priced=self.simulated)
        s = self.summary()
        lines.append("")
        by_cat = ", ".join(f"{c} {v:.3f}" for c, v in s["by_cat"].items())
        oracle_by_cat = ", ".join(f"{c} {v:.3f}" for c, v in s["oracle_by_cat"].items())
        lines.append(f"by category (geomean speedup): {by_cat}")
        lines.append(f"oracle bound by category:      {oracle_by_cat}")
        lines.append(
            f"geomean {s['geomean']:.3f} (oracle {s['oracle_geomean']:.3f}, all sources {s['oracle_all_sources']:.3f})"
            f"  min {s['min_speedup']:.3f}  "
            f"identical {s['identical']}/{s['n']}  mean tokens/step {s['tokens_per_step']:.2f}"
        )
        lines.append(f"replies that looped: {s['looped']} of {s['n']} ({s['stopped_by_guard']} stopped by the guard); "
                     f"over the {s['n'] - s['looped']} that did not: geomean {s['geomean_not_looped']:.3f}  "
                     f"min {s['min_not_looped']:.3f}")
        lines.append(f"settings: {s['settings']}, {self.max_tokens} tokens at most")
        by_source = ", ".join(f"{k} {v}" for k, v in s["accepted_by_source"].items()) or "none"
        lines.append(f"accepted draft tokens by source: {by_source}")
        if s["under_schema"]:
            lines.append(f"replies under a schema: {s['follow_schema']} of {s['under_schema']} whole JSON that "
                         f"follows it; {s['grammar_share']:.1%} of all reply tokens drafted from the text the grammar "
                         "forced")
        if s["drafted_steps"]:
            lines.append(f"steps that verified a draft: {s['drafted_steps']}, of which {s['landed_steps']} "
                         f"({s['landed_steps'] / s['drafted_steps']:.0%}) accepted some of it")
        if self.replay is not None:
            lines.append(f"(drafts replayed from plain decoding's reply, right at {self.replay:.0%} of its positions "
                         f"and wrong from their first token elsewhere)")
        if self.simulated:
            lines.append("(simulated: both runs priced on the what-if curve, tokens from the real runs)")
        return "\n".join(lines)


def run_one(
    engine: Engine,
    prompt: Sequence[int],
    lookahead: LookaheadConfig | None,
    max_tokens: int,
    record_gaps: bool = False,
    exact_only: bool = True,
    cancel: threading.Event | None = None,
    sampling: SamplingConfig = APP_SAMPLING,
    loop_guard: bool = APP_LOOP_GUARD,
    constraint: Constraint | None = None,
) -> RunStats:
    """One generation from an empty cache; setting ``cancel`` ends it before its next step."""
    engine.reset()
    controls = GenerationControls(lookahead=lookahead)
    if cancel is not None:
        controls.cancel = cancel
    return RunStats.of(
        engine.generate(
            prompt,
            controls,
            sampling=sampling,
            stop=StopConfig(max_tokens=max_tokens, loop_guard=loop_guard),
            record_gaps=record_gaps,
            exact_only=exact_only,
            constraint=constraint,
        )
    )


def run_bench(
    engine: Engine,
    workloads: Sequence[Workload],
    lookahead: LookaheadConfig,
    max_tokens: int = 128,
    on_result: Callable[[PromptResult], None] | None = None,
    cancel: threading.Event | None = None,
    null: bool = False,
    price_on: CostCurve | None = None,
    earlier_chats: bool = True,
    replay: float | None = None,
    exact_pairs: int | None = None,
    sampling: SamplingConfig = APP_SAMPLING,
    loop_guard: bool = APP_LOOP_GUARD,
) -> BenchReport:
    """Plain against ``lookahead`` on every workload, every reply written with ``sampling`` and ``loop_guard``
    (the app's defaults unless told). Long for its options, not its steps: each is passed through once.

    ``null`` runs plain in both places instead, on the same schedule: the
    "speedups" it reports are this machine's timing noise. Setting ``cancel``
    stops the run in flight at its next step; the report then holds the prompts
    measured in full before it. ``price_on`` (a what-if curve, with the engine
    planning on it: ``Engine.plan_with``) runs each mode once and reports the
    simulated speedup on that curve; the timed one stays in ``bench.measured_speedup``.

    ``earlier_chats``: each prompt may draft from the ones before it, as from a
    user's earlier chats with the model (their text, and the n-grams kept from
    their replies); never from its own runs, so every run of a prompt starts
    from the same drafts.

    ``replay``: each prompt's plain reply is recorded first and offered back as drafts, right at this share
    of its positions (engine/decoding/replay.py); the prompts draft from nothing else beyond themselves.

    ``exact_pairs``: time every prompt in that many pairs of runs (whole A-B-B-A blocks) instead of stopping once
    they agree (``compare_decoders``).
    """
    cancel = cancel if cancel is not None else threading.Event()
    results: list[PromptResult] = []
    second_mode = None if null else lookahead
    reply = _Reply(StopConfig(max_tokens=max_tokens, loop_guard=loop_guard), sampling)
    if workloads:  # warm-up: page in the weights before anything is timed
        run_one(engine, engine.render_chat([Message("user", workloads[0].prompt)]), None, 16, cancel=cancel)
    earlier = _EarlierChats() if earlier_chats and replay is None else None
    saved = engine.corpus, engine.kept, engine.keep_replies
    engine.corpus, engine.kept = (earlier.corpus, earlier.kept) if earlier else (None, None)
    engine.keep_replies = False  # a prompt's runs must not draft from each other
    try:
        for k, w in enumerate(workloads):
            if cancel.is_set():
                break
            res = _bench_prompt(engine, w, k % 2 == 1, second_mode, reply, cancel, price_on, earlier,
                                replay=None if replay is None else (replay, k), exact_pairs=exact_pairs)
            if res is None:
                break
            results.append(res)
            if on_result:
                on_result(res)
    finally:
        engine.corpus, engine.kept, engine.keep_replies = saved
    return BenchReport(
        results=results,
        model=engine.summary.path,
        lookahead={"null": True} if null else asdict(lookahead),
        replay=replay,
        threads=engine.n_threads,
        max_tokens=max_tokens,
        simulated=price_on is not None,
        sampling=sampling,
        loop_guard=loop_guard,
    )


@dataclass(frozen=True)
class _Reply:
    """How each of a bench's replies is written."""

    stop: StopConfig
    sampling: SamplingConfig

    def run(self, engine: Engine, prompt: Sequence[int], cancel: threading.Event, record_gaps: bool = False,
            constraint: Constraint | None = None) -> RunStats:
        """Plain decoding's reply, from an empty cache (following ``constraint``, if any)."""
        return run_one(engine, prompt, None, self.stop.max_tokens, record_gaps=record_gaps, cancel=cancel,
                       sampling=self.sampling, loop_guard=self.stop.loop_guard, constraint=constraint)


def _bench_prompt(
    engine: Engine,
    w: Workload,
    lookahead_first: bool,
    second_mode: LookaheadConfig | None,
    reply: _Reply,
    cancel: threading.Event,
    price_on: CostCurve | None = None,
    earlier: _EarlierChats | None = None,
    replay: tuple[float, int] | None = None,
    exact_pairs: int | None = None,
) -> PromptResult | None:
    """One prompt's row; None when ``cancel`` was set meanwhile (a prompt measured in part is no result).

    A workload with attached files sends them as the app does: whole or the best passages in the prompt,
    and every file whole to draft from. ``replay``: (share of right drafts, seed) for replayed drafts;
    ``exact_pairs``: as ``run_bench``'s.
    """
    with workload_prompt(engine, w, reply.stop.max_tokens) as (prompt, context):
        seen = None if context is None else {name: round(f, 3) for name, f in context.coverage.items()}
        with _replayed(engine, prompt, replay, reply, cancel):
            return _bench_prompt_runs(engine, w, prompt, lookahead_first, second_mode, reply, cancel, price_on,
                                      earlier, seen, exact_pairs)


@contextmanager
def _replayed(
    engine: Engine, prompt: list[int], replay: tuple[float, int] | None, reply: _Reply, cancel: threading.Event,
) -> Iterator[None]:
    """With ``replay`` (share of right drafts, seed): plain's reply to ``prompt``, recorded by an untimed run, is
    the engine's only document to draft from until the block ends."""
    if replay is None:
        yield
        return
    recorded = reply.run(engine, prompt, cancel)
    saved = engine.documents
    engine.documents = ReplayDrafts(prompt, recorded.token_ids, replay[0], engine.ctx.n_vocab, replay[1])
    try:
        yield
    finally:
        engine.documents = saved


@contextmanager
def workload_prompt(
    engine: Engine, w: Workload, max_tokens: int,
) -> Iterator[tuple[list[int], DocumentContext | None]]:
    """``w``'s prompt as the app sends it (a chat message), and what of its attached files it holds.

    With files attached, the message holds them whole or their best passages, and the engine drafts from
    every file whole until the block ends.
    """
    if not w.attach:
        yield engine.render_chat([Message("user", w.prompt)]), None
        return
    docs = [read_document(path) for path in w.attach]
    messages, context = attach_documents(ChatSession(engine), [Message("user", w.prompt)], docs, max_tokens)
    engine.set_documents([d.text for d in docs])
    try:
        yield engine.render_chat(messages), context
    finally:
        engine.set_documents([])


def _bench_prompt_runs(
    engine: Engine,
    w: Workload,
    prompt: list[int],
    lookahead_first: bool,
    second_mode: LookaheadConfig | None,
    reply: _Reply,
    cancel: threading.Event,
    price_on: CostCurve | None,
    earlier: _EarlierChats | None,
    documents_seen: dict[str, float] | None,
    exact_pairs: int | None = None,
) -> PromptResult | None:
    # The one measurement of engine/speed/comparison.py, as the app's Compare tab and speed report take it:
    # A-B-B-A pairs (the first mode alternating per prompt) until their speedups agree (or ``exact_pairs``), median
    # runs.
    constraint = Constraint("json_schema", w.schema) if w.schema else None
    comparison = compare_decoders(engine, prompt, second_mode, sampling=reply.sampling, stop=reply.stop,
                                  plain_first=not lookahead_first, cancel=cancel,
                                  max_pairs=1 if price_on is not None else None,  # priced, not timed: one pair
                                  exact_pairs=exact_pairs, constraint=constraint)
    if cancel.is_set() or not comparison.complete:
        return None
    res = prompt_result(w, comparison)
    verdict = comparison.verdict
    assert verdict is not None
    plain, la = verdict.plain, verdict.lookahead
    if comparison.divergence is not None:
        # The timed run skips the top-2 bookkeeping; an untimed one supplies the gap.
        gapped = reply.run(engine, prompt, cancel, record_gaps=True, constraint=constraint)
        if cancel.is_set():
            return None
        div = first_divergence(gapped, la, engine.detokenize)
        res.first_divergence = None if div is None else div.as_dict()
    measured = None
    if price_on is not None:
        measured, res.speedup = res.speedup, round(simulated_speedup(plain, la, price_on), 4)
    all_sources = None
    if earlier is not None:
        all_sources = round(oracle_bound(prompt, plain.token_ids, engine.cost_curve, others=earlier.texts), 4)
        earlier.add(engine.tokenize(w.prompt, add_special=False), plain.token_ids)
    # Rate after the first token, the way the llama-cpp-python reference is timed.
    rest = plain.elapsed_s - (plain.first_token_s or 0.0)
    res.bench = BenchFigures(
        measured_speedup=measured,
        oracle_bound=round(oracle_bound(prompt, plain.token_ids, engine.cost_curve), 4),
        oracle_all_sources=all_sources,
        runs=2 * len(comparison.pairs),
        drafted=la.n_drafted,
        accepted=la.n_accepted,
        drafted_steps=la.drafted_steps,
        landed_steps=la.landed_steps,
        plain_tps_after_first=round((plain.n_tokens - 1) / rest, 2) if rest > 0 else 0.0,
        documents_seen=documents_seen,
        follows_schema=follows(engine.model, constraint, plain.token_ids) if constraint is not None else None,
    )
    return res


class _EarlierChats:
    """What a user's earlier chats give the next prompt: their text to match, and their replies' n-grams kept."""

    def __init__(self) -> None:
        self.corpus = CorpusIndex()
        self.kept = kept_ngrams.empty()
        self.texts: list[list[int]] = []

    def add(self, message: Sequence[int], reply: Sequence[int]) -> None:
        text = [*message, *reply]
        self.texts.append(text)
        self.corpus.add(text)
        pool = kept_ngrams.empty()
        pool.add_tokens(reply, origin=DraftOrigin.REPLY)
        kept_ngrams.keep(self.kept, pool)


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
    """Every config on every prompt; each prompt's plain decoding is timed by the faster of a run before and after."""
    per_cfg: list[list[PromptResult]] = [[] for _ in configs]
    for w in workloads:
        with workload_prompt(engine, w, max_tokens) as (prompt, _seen):
            before = run_one(engine, prompt, None, max_tokens)
            runs = [run_one(engine, prompt, cfg, max_tokens) for cfg in configs]
            after = run_one(engine, prompt, None, max_tokens)
        plain = max(before, after, key=lambda r: r.tokens_per_s)  # a sweep: one run per setting, not pairs
        for rows, la in zip(per_cfg, runs, strict=True):
            rows.append(PromptResult.from_runs(w, plain, la, identical=la.token_ids == before.token_ids))
        if on_prompt:
            on_prompt(w.id)
    grid = []
    for cfg, results in zip(configs, per_cfg, strict=True):
        cats, overall = _split_roll_up(results)
        grid.append(
            GridRow(
                window=cfg.window,
                ngram=cfg.ngram,
                guesses=cfg.guesses,
                geomean=round(overall.speedup, 4),
                by_cat={c.cat: round(c.speedup, 4) for c in cats},
                tokens_per_step=round(overall.tokens_per_step, 3),
                identical=overall.identical,
                n=overall.n,
            )
        )
    return grid


def oracle_bound(
    context: Sequence[int],
    output: Sequence[int],
    curve: CostCurve,
    max_draft: int = 16,
    others: Sequence[Sequence[int]] = (),
) -> float:
    """Speedup of an oracle that drafts, from the prompt and history only, exactly what will be accepted.

    At each step the oracle may verify any prefix of the longest earlier
    continuation of the last committed token that equals the true output, and
    picks the step lengths that minimise total cost (the cost curve prices
    each step). Plain decoding costs ``cost(1)`` per token. ``others`` are more
    texts it may copy from (earlier chats); no copy runs from one into the next.
    """
    seq = [t for text in others for t in (*text, -1)] + list(context)
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

    from engine.llama.backend import ensure_backend

    ensure_backend()  # a portable build's CPU backend, registered where llama.cpp reads it
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
