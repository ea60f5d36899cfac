"""Statistics of one reply, built from the engine's step events; stored with the message.

No Qt here: the live panel and the stats line under each reply both read these.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from engine import StepEvent


@dataclass
class ReplyStats:
    """What a finished (or stopped) reply cost, and how lookahead did."""

    n_tokens: int = 0
    steps: int = 0  # forward passes that committed tokens
    decode_s: float = 0.0
    first_token_s: float | None = None  # prompt evaluation + first step
    n_drafted: int = 0
    n_accepted: int = 0
    modes: list[str] = field(default_factory=list)  # distinct modes in order of first use
    window: int = 0  # lookahead shape of the last lookahead step
    ngram: int = 0
    guesses: int = 0
    auto: bool = False
    model: str = ""
    stop_reason: str | None = None
    per_step: list[int] = field(default_factory=list)  # tokens committed by each step
    elapsed_s: float = 0.0  # prompt evaluation + all steps

    def observe(self, ev: StepEvent, auto: bool = False) -> None:
        """Fold one step event in (in order)."""
        self.elapsed_s += ev.elapsed_s + ev.prefill_s
        if ev.mode != "none":
            self.steps += 1
            self.per_step.append(ev.n_committed)
            self.decode_s += ev.elapsed_s
            if ev.mode not in self.modes:
                self.modes.append(ev.mode)
        if ev.mode == "lookahead":
            self.window, self.ngram, self.guesses, self.auto = ev.window, ev.ngram, ev.guesses, auto
        if ev.token_ids and self.first_token_s is None:
            self.first_token_s = self.elapsed_s
        self.n_tokens += len(ev.token_ids)
        self.n_drafted += ev.n_drafted
        self.n_accepted += ev.n_accepted
        if ev.stop_reason:
            self.stop_reason = ev.stop_reason

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.n_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens; None when nothing was drafted."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def mode(self) -> str:
        if not self.modes:
            return "none"
        return self.modes[0] if len(self.modes) == 1 else "mixed"

    def shape_text(self) -> str:
        if "lookahead" not in self.modes:
            return ""
        prefix = "auto, last " if self.auto else ""
        return f"{prefix}W{self.window} N{self.ngram} G{self.guesses}"

    def summary_line(self) -> str:
        """One line shown under a reply, e.g. ``48 tokens · 95.1 tok/s · TTFT 0.08 s · 1.50 tok/step · lookahead W4 N4 G3 · model``."""
        parts = [f"{self.n_tokens} tokens", f"{self.tokens_per_s:.1f} tok/s"]
        if self.first_token_s is not None:
            parts.append(f"TTFT {self.first_token_s:.2f} s")
        parts.append(f"{self.tokens_per_step:.2f} tok/step")
        shape = self.shape_text()
        parts.append(f"{self.mode} {shape}".strip())
        if self.acceptance is not None:
            parts.append(f"accepted {self.acceptance:.0%}")
        if self.model:
            parts.append(self.model)
        if self.stop_reason and self.stop_reason not in ("eog", "stop_string"):
            parts.append({"cancelled": "stopped", "max_tokens": "length limit", "context_full": "context full"}.get(
                self.stop_reason, self.stop_reason))
        return " · ".join(parts)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> "ReplyStats | None":
        """Parse stored stats; None for messages without any (or unreadable ones)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in names})
        except (ValueError, TypeError):
            return None
