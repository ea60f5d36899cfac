"""What steps cost on this PC as an engine runs: Auto's cost curve, measuring it, and the thread governor.

``CostModel`` is the part of ``Engine`` (engine/decoding/runtime.py) that prices steps for Auto: on the reference
curve until this machine's is cached or measured (calibration.py, exactness.py), on another machine's when asked
to plan as if there (``plan_with``), corrected as steps run (``LiveCosts``, one per thread count). It also keeps
the thread count decodes run with (``ThreadGovernor``, contention.py), which hears every decode.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from engine.costs.calibration import curve_for, measure
from engine.costs.contention import CpuLoad, DecodeSample, ThreadGovernor
from engine.costs.curve import DEFAULT_CURVE, CostCurve, LiveCosts, load_cached
from engine.costs.exactness import QUICK_PROBE_SIZES, MeasurementCancelled, probe_exact_batch, probe_threads_agree
from engine.costs.parts import CacheParts, LoadedParts, ThreadParts
from engine.llama.native import Batch


class _Measured(NamedTuple):
    """An engine's parts as measuring drives them (``parts.Measurable``)."""

    loaded: LoadedParts
    cache: CacheParts
    costs: ThreadParts


class CostModel:
    """The curve Auto prices steps on, where it came from, its live corrections, and the threads decodes use.

    ``curve_source``: "default" | "quick-probed" | "probed" | "cached" | "measured" | "what-if" | "pinned".
    Measuring and probing keep what the cache held (``CacheParts.cache_kept``).
    """

    def __init__(self, loaded: LoadedParts, cache: CacheParts, pinned: CostCurve | None = None) -> None:
        """``pinned``: the curve ``LOOKAHEAD_COST_CURVE`` names (whatif.curve_from_env); no measurement or live
        step time replaces it."""
        self._loaded = loaded
        self._cache = cache
        self._ctx = loaded.ctx
        self._pinned_curve = pinned
        self._reference_curve = pinned or DEFAULT_CURVE
        # Whether a decode gives the same logits at fewer threads (None: not probed yet). Until it is known
        # to, the governor keeps every thread: a result that depended on the count would change the text.
        self.threads_agree: bool | None = None
        self.governor = ThreadGovernor(loaded.n_threads, adapt=False, load=CpuLoad.for_this_process())
        self._ctx.on_decode = self.after_decode
        # Auto plans with the reference curve until this machine's is loaded or measured. Its batch
        # cap is a guess until probed: the first lookahead generation runs the quick probe (Engine.generate).
        self.curve: CostCurve = self._reference_curve
        self.curve_source = "default"
        self._live: dict[int, LiveCosts] = {}  # per thread count: the curve of that count, corrected as it runs
        self._machine_curves: dict[int, CostCurve] = {}  # per thread count: what the governor prices decodes on
        self._live_learn = pinned is None
        self._before_what_if = (self.curve, self.curve_source)  # what plan_with(None) goes back to

    @property
    def curve_measured(self) -> bool:
        """True once Auto plans with this machine's own curve (cached or measured now), or the pinned one."""
        return self.curve_source in ("cached", "measured", "pinned")

    def _use_curve(self, curve: CostCurve, source: str) -> None:
        self.curve = curve
        self.curve_source = source
        self._live = {}
        self._machine_curves = {}
        self._live_learn = source != "what-if" and self._pinned_curve is None
        if source == "cached" and self.threads_agree is None:
            self.threads_agree = curve.threads_agree
        if curve.rest_floor is not None:
            self.governor.rest = curve.rest
        self._let_governor_adapt()

    def _let_governor_adapt(self) -> None:
        """The governor changes the thread count only where that changes no logit and the count is the engine's."""
        loaded = self._loaded
        self.governor.adapt = bool(self.threads_agree) and loaded.threads_chosen and loaded.n_threads > 1

    @property
    def live_costs(self) -> LiveCosts:
        """What Auto prices the next step with: the costs of the thread count it will run on."""
        return self.live_costs_for(self._ctx.n_threads)

    def live_costs_for(self, threads: int) -> LiveCosts:
        live = self._live.get(threads)
        if live is None:
            live = self._live[threads] = LiveCosts(self.curve.for_threads(threads), learn=self._live_learn)
        return live

    def after_decode(self, batch: Batch, wall: float, cpu: float) -> None:
        """Every decode: tell the governor how it ran, and apply the thread count it asks for."""
        n = batch.n_tokens
        n_logits = int(np.count_nonzero(batch.logits[:n])) if n > 1 else 1
        threads = self._ctx.n_threads
        curve = self._machine_curves.get(threads)
        if curve is None:  # this PC's own, also while Auto plans on another machine's (plan_with)
            own = self._before_what_if[0] if self.curve_source == "what-if" else self.curve
            curve = self._machine_curves[threads] = own.for_threads(threads)
        threads = self.governor.observe(DecodeSample(wall, cpu, threads, curve.cost(n, max(n_logits, 1))))
        if self.governor.adapt and threads != self._ctx.n_threads:  # else the count is the caller's to set
            self._ctx.set_threads(threads)

    @property
    def threads_in_use(self) -> int:
        return self._ctx.n_threads

    @contextlib.contextmanager
    def all_threads(self) -> Iterator[None]:
        """Decode with every thread and no governor inside (measuring, probing); starts afresh after."""
        adapt = self.governor.adapt
        self.governor.adapt = False
        self._ctx.set_threads(self._loaded.n_threads)
        try:
            yield
        finally:
            self.governor.reset()
            self.governor.adapt = adapt
            self._ctx.set_threads(self._loaded.n_threads)

    def plan_with(self, curve: CostCurve | None) -> None:
        """Let Auto plan with ``curve``, another machine's (engine/costs/whatif.py), as if it ran there.

        Steps stay within the batch size this machine gives exact logits for (probed if unknown),
        and live step times do not correct the curve: they are this machine's, not that one's.
        ``None`` goes back to this machine's curve (the cached one, or the reference until measured).
        """
        if curve is None:
            if self.curve_source == "what-if":
                self._use_curve(*self._before_what_if)
            return
        cap = self.probe_exact_cap()
        if self.curve_source != "what-if":
            self._before_what_if = (self.curve, self.curve_source)
        self._use_curve(replace(curve, max_exact_batch=min(cap, curve.max_exact_batch)), "what-if")

    def probe_exact_cap(self) -> int:
        """Make sure steps stay within batches measured exact for this model: probe quickly if nothing is known.

        Costs a 300-token prompt and two decodes of each of ``QUICK_PROBE_SIZES`` the first time; the cache holds
        what it held before after it.
        """
        if self.curve_source == "default" and not self.load_cached_curve():
            with self._cache.cache_kept():
                cap = probe_exact_batch(self._measured(), sizes=QUICK_PROBE_SIZES)
            self._use_curve(replace(self._reference_curve, max_exact_batch=cap), "quick-probed")
        return self.curve.max_exact_batch

    def probe_threads(self, cancel: threading.Event | None = None) -> bool:
        """Find out, if not known yet, whether the thread count may change (one thread gives all threads' logits),
        so that the thread governor works from the first reply, plain decoding's too. A cached curve knows;
        else a short probe (about a second; the cache is kept); ``cancel`` stops it (``MeasurementCancelled``)
        and it stays unknown. True once known."""
        if self.threads_agree is None:
            self.load_cached_curve()
        if self.threads_agree is None:
            with self._cache.cache_kept():
                agree = probe_threads_agree(self._measured(), cancel)
            self.threads_agree = agree
            self._let_governor_adapt()
        return self.threads_agree is not None

    def load_cached_curve(self) -> bool:
        """Use the curve measured before for this model, threads and CPU, if there is one (instant)."""
        if self._pinned_curve is None and not self.curve_measured:
            cached = load_cached(self._loaded.summary.path, self._loaded.n_threads)
            if cached is not None:
                self._use_curve(cached, "cached")
        return self.curve_measured

    def tune(
        self,
        refresh: bool = False,
        budget_s: float = 6.0,
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> CostCurve:
        """Load (or measure, when missing or ``refresh``) this machine's cost curve for Auto.

        Measuring takes a few seconds; the cache holds what it held before after it. ``progress`` hears
        0..1; setting ``cancel`` stops it with ``MeasurementCancelled`` (Auto then
        keeps planning with the reference curve, capped by the exact-batch probe
        when that had finished). With a pinned curve (``LOOKAHEAD_COST_CURVE``)
        only the exact-batch probe runs: which batches are exact is this model's
        and CPU's, whatever the costs are taken to be.
        """
        with self._cache.cache_kept():
            return self._tune(refresh, budget_s, progress, cancel)

    def _tune(
        self,
        refresh: bool,
        budget_s: float,
        progress: Callable[[float], None] | None,
        cancel: threading.Event | None,
    ) -> CostCurve:
        probed = self.curve.max_exact_batch if self.curve_source == "probed" else None
        pinned = self._pinned_curve
        engine = self._measured()
        try:
            if pinned is not None:
                if self.curve_source == "pinned" and not refresh:
                    return self.curve
                curve = measure(engine, progress=progress, cancel=cancel, max_exact_batch=probed, pinned=pinned)
                source = "pinned"
            else:
                curve, measured = curve_for(
                    engine, refresh=refresh, budget_s=budget_s, progress=progress, cancel=cancel, max_exact_batch=probed
                )
                source = "measured" if measured else "cached"
        except MeasurementCancelled as exc:
            if exc.max_exact_batch is not None and not self.curve_measured:
                self._use_curve(replace(self._reference_curve, max_exact_batch=exc.max_exact_batch), "probed")
            raise
        self._use_curve(curve, source)
        return self.curve

    def _measured(self) -> _Measured:
        return _Measured(self._loaded, self._cache, self)
