"""What-if cost curves: planning and pricing a run as if it ran on another machine.

A cost curve says what a batch of n tokens costs relative to a 1-token step
(curve.py). This machine's curve is measured; another machine's can be
measured there (``engine tune --save FILE``). ``engine bench --curve FILE``
lets Auto plan with it and prices both runs on it: the tokens are this
machine's real output, only the cost is assumed.

The example laptop curves the tests plan on (``tests/data/curves/*.json``)
were derived here from a roofline model whose inputs each file states with
their sources:

    t(n, k) = smax(B_body / BW, n * F_body / R)     the transformer layers
            + smax(B_head / BW, k * F_head / R)     the output matrix, k logit rows
            + B_kv(ctx + n) / BW                    reading the KV cache once

    B = bytes of weights read per step, F = 2 * parameters (FLOPs per token),
    BW = effective memory bandwidth, R = effective compute rate,
    smax(a, b) = (a^s + b^s)^(1/s), a roofline whose corner is rounded.

BW and R are effective rates: measured token generation (tg128, memory-bound)
and prompt processing (pp512, compute-bound) speeds of llama.cpp on that
machine and model, turned into bytes and FLOPs per second. s = 3 reproduces a
published small-batch measurement of an 8B Q4_K_M model on a 12-thread CPU
(pp4, pp8, pp16, pp32 against tg128) within 5% (tests/engine/costs/test_whatif.py holds
it); fed a machine's own llama-bench speeds, the same model predicted a far
flatter curve than ``engine tune`` measured there. So the derived curves are
the tests' examples of a flat curve, not a laptop's measured costs: no speed
this project states rests on them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.costs.curve import COST_CURVE_ENV, REFERENCE_CURVES, CostCurve

# Batch sizes a derived curve is tabulated at: the sizes engine tune measures.
CURVE_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)


class CurveFileError(ValueError):
    """A curve file is missing or not a cost curve; the message says which."""


@dataclass(frozen=True)
class Roofline:
    """One machine running one model, in the terms of the roofline model above."""

    body_bytes: float  # weights of the transformer layers, read once per step
    head_bytes: float  # the output matrix (read once per step when any logits are asked for)
    body_params: float  # parameters of the layers: a token costs 2x this in FLOPs
    head_params: float  # n_vocab x n_embd
    kv_bytes_per_token: float  # K+V cache of one token over all layers
    context: int  # tokens in the cache during the reply
    bandwidth: float  # effective memory bandwidth, bytes/s
    compute: float  # effective compute rate, FLOP/s
    threads: int
    sharpness: float = 3.0  # s of the rounded corner

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Roofline:
        return cls(**{k: obj[k] for k in cls.__dataclass_fields__})

    def seconds(self, n: int, k: int) -> float:
        """The roofline time of a batch of ``n`` tokens of which ``k`` ask for logits."""
        s = self.sharpness

        def smax(a: float, b: float) -> float:
            return float((a**s + b**s) ** (1 / s))

        body = smax(self.body_bytes / self.bandwidth, n * 2 * self.body_params / self.compute)
        head = smax(self.head_bytes / self.bandwidth, k * 2 * self.head_params / self.compute) if k else 0.0
        kv = (self.context + n) * self.kv_bytes_per_token / self.bandwidth
        return body + head + kv

    def curve(self, max_exact_batch: int = 64) -> CostCurve:
        base = self.seconds(1, 1)
        return CostCurve(
            sizes=CURVE_SIZES,
            last_logit=tuple(round(self.seconds(n, 1) / base, 4) for n in CURVE_SIZES),
            all_logits=tuple(round(self.seconds(n, n) / base, 4) for n in CURVE_SIZES),
            base_ms=round(base * 1000, 2),
            threads=self.threads,
            max_exact_batch=max_exact_batch,
        )


def load_curve(path: str | Path) -> CostCurve:
    """A curve from ``engine tune --save`` (or a what-if file in the same format)."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CurveFileError(f"no such curve file: {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CurveFileError(f"cannot read curve file {p}: {exc}") from None
    try:
        curve = CostCurve.from_json(obj)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CurveFileError(f"{p} is not a cost curve (missing or bad {exc})") from None
    if not curve.sizes or curve.sizes[0] != 1 or len(curve.sizes) != len(curve.all_logits) != len(curve.last_logit):
        raise CurveFileError(f"{p} is not a cost curve: its sizes and costs do not line up")
    return curve


def curve_from_env() -> CostCurve | None:
    """The curve ``LOOKAHEAD_COST_CURVE`` names (a reference curve's name or a curve file), if it is set.

    An engine then plans with it instead of measuring this machine (see ``Engine.tune``).
    """
    spec = os.environ.get(COST_CURVE_ENV, "").strip()
    if not spec:
        return None
    if spec in REFERENCE_CURVES:
        return REFERENCE_CURVES[spec]
    try:
        return load_curve(spec)
    except CurveFileError as exc:
        names = ", ".join(REFERENCE_CURVES)
        raise CurveFileError(f"{COST_CURVE_ENV}={spec!r}: {exc} (or one of: {names})") from None


def save_curve(curve: CostCurve, path: str | Path, **about: Any) -> None:
    """Write ``curve`` in the format ``load_curve`` reads (``about``: extra keys, e.g. the model's name)."""
    Path(path).write_text(json.dumps({**about, **curve.to_json()}, indent=1) + "\n", encoding="utf-8")
