"""A reply's statistics as the app shows and stores them.

The counting is ``engine.speed.run_stats.RunStats``'s; this adds what the app knows
besides the events (the model's name, whether Auto chose the shape), the line
shown under a reply, and the JSON stored with the message. No Qt here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine import RunStats, StepEvent

# What a message row stores: the counts, not the tokens or text (the message holds the text).
# Rows written before RunStats existed have exactly these keys, so they load as they are.
STORED_FIELDS = (
    "n_tokens", "steps", "decode_s", "first_token_s", "n_drafted", "n_accepted", "modes", "window", "ngram",
    "guesses", "auto", "model", "stop_reason", "per_step", "elapsed_s", "prompt_tokens", "prompt_cached_tokens",
    "prefill_tokens", "system_tokens", "dropped_messages", "cost",
)
# Kept only when set (rows written before they were counted stay as they were).
OPTIONAL_FIELDS = {
    "prompt_tokens", "prompt_cached_tokens", "prefill_tokens", "system_tokens", "dropped_messages", "cost",
}

STOP_WORDS = {"cancelled": "stopped", "max_tokens": "length limit", "context_full": "context full",
              "loop": "stopped: the reply was repeating itself"}


@dataclass
class ReplyStats(RunStats):
    """What a finished (or stopped) reply cost, and how lookahead did."""

    auto: bool = False  # the last lookahead shape was chosen by Auto
    model: str = ""
    # Forward passes that offered a draft (not stored: 0 for a reply loaded from the chat store).
    drafting_steps: int = 0

    def observe(self, ev: StepEvent, auto: bool = False) -> None:
        """Fold one step event in (in order); ``auto``: the reply runs in Auto mode."""
        super().observe(ev)
        if ev.mode == "lookahead":
            self.auto = auto
        if ev.n_drafted:
            self.drafting_steps += 1

    def speedup_text(self) -> str:
        """What the steps predict against plain decoding, e.g. ``≈1.3× vs plain``; "" when no step was priced, or
        when the reply was stopped for repeating itself (drafts land in a loop: no speed of text worth keeping)."""
        estimate = self.predicted_speedup
        return f"≈{estimate:.1f}× vs plain" if estimate > 0 and self.stop_reason != "loop" else ""

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
        """One line shown under a reply.

        For example ``48 tokens · 95.1 tok/s · TTFT 0.08 s · prompt 40 tokens (0 cached, 900 tok/s) · 1.50 tok/step ·
        ≈1.3× vs plain · lookahead W4 N4 G3 · model``. The estimate against plain decoding is there only for
        replies whose steps were priced (not those stored before steps carried a cost).
        """
        parts = [f"{self.n_tokens} tokens", f"{self.tokens_per_s:.1f} tok/s"]
        if self.first_token_s is not None:
            parts.append(f"TTFT {self.first_token_s:.2f} s")
        if self.prompt_tokens:
            prompt = f"prompt {self.prompt_tokens} tokens ({self.prompt_cached_tokens} cached"
            if self.prompt_tokens_per_s > 0:
                prompt += f", {self.prompt_tokens_per_s:.0f} tok/s"
            parts.append(prompt + ")")
        parts.append(f"{self.tokens_per_step:.2f} tok/step")
        if self.speedup_text():
            parts.append(self.speedup_text())
        parts.append(f"{self.mode} {self.shape_text()}".strip())
        if self.acceptance is not None:
            parts.append(f"accepted {self.acceptance:.0%}")
        if self.model:
            parts.append(self.model)
        if self.stop_reason and self.stop_reason not in ("eog", "stop_string"):
            parts.append(STOP_WORDS.get(self.stop_reason, self.stop_reason))
        return " · ".join(parts)

    def to_stats_json(self) -> str:
        """The stats as stored with the message (its ``stats_json``)."""
        values = {name: getattr(self, name) for name in STORED_FIELDS}
        return json.dumps({k: v for k, v in values.items() if v or k not in OPTIONAL_FIELDS})

    @classmethod
    def from_stats_json(cls, text: str | None) -> ReplyStats | None:
        """Parse stored stats; None for messages without any (or unreadable ones)."""
        if not text:
            return None
        try:
            data: dict[str, Any] = json.loads(text)
            return cls(**{k: v for k, v in data.items() if k in STORED_FIELDS})
        except (ValueError, TypeError, AttributeError):
            return None
