"""How each piece of a reply came: the model's own token of a step, or a verified draft token and its source.

Built from the step events as a reply streams (``TokenMarks.observe``), kept
with the message (``to_json``) and shown by the chat when View → Show lookahead
is on. Consecutive tokens of one step from one source form a run; the runs'
texts join to the reply's text exactly. No Qt here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine import StepEvent

OWN = "own"

# What each source is called in the legend and the tooltips, in the legend's order.
SOURCE_NAMES = {
    OWN: "the model's own token",
    "prompt": "drafted from the prompt",
    "reply": "drafted from this reply",
    "history": "drafted from left-out turns or the text being regenerated",
    "other_chats": "drafted from earlier chats",
    "kept": "drafted from the n-gram pool",
    "window": "drafted by the Jacobi window",
}
SHORT_NAMES = {
    OWN: "model's own",
    "prompt": "prompt",
    "reply": "this reply",
    "history": "earlier text",
    "other_chats": "earlier chats",
    "kept": "n-gram pool",
    "window": "Jacobi window",
}


@dataclass
class Run:
    """Text that came the same way in one forward pass."""

    text: str
    source: str  # OWN or a StepEvent.draft_source
    step: int
    batch: int  # the batch size of that step

    def describe(self) -> str:
        name = SOURCE_NAMES.get(self.source, f"drafted from {self.source}")
        return f"step {self.step + 1} · {name} · batch of {self.batch}"


@dataclass
class TokenMarks:
    """The runs of a reply, in order."""

    runs: list[Run] = field(default_factory=list)

    def text(self) -> str:
        return "".join(r.text for r in self.runs)

    def observe(self, ev: StepEvent) -> None:
        """Fold in the next step event (events without per-token sources count as the model's own text)."""
        pieces = ev.token_texts if ev.token_sources else ((ev.text,) if ev.text else ())
        sources = ev.token_sources or (OWN,) * len(pieces)
        for text, source in zip(pieces, sources, strict=False):
            if text:
                self._add(text, source, ev.step, ev.batch_size)
        told = sum(len(p) for p in pieces)
        if len(ev.text) > told:  # text no token brought (the tail of a stopped reply)
            self._add(ev.text[told:], OWN, ev.step, ev.batch_size)

    def _add(self, text: str, source: str, step: int, batch: int) -> None:
        last = self.runs[-1] if self.runs else None
        if last is not None and last.source == source and (last.step == step or batch == 0):
            last.text += text  # batch 0: the closing event of a stopped reply, no forward pass
        else:
            self.runs.append(Run(text, source, step, batch))

    def by_source(self) -> dict[str, int]:
        """Characters per source."""
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.source] = out.get(r.source, 0) + len(r.text)
        return out

    def to_json(self) -> str:
        """Stored without the text (the message holds it): [[length, source, step, batch], ...]."""
        return json.dumps([[len(r.text), r.source, r.step, r.batch] for r in self.runs])

    @classmethod
    def from_json(cls, text: str, stored: str | None) -> TokenMarks | None:
        """The marks of a message whose text is ``text``; None without any, or if they do not fit the text."""
        if not stored:
            return None
        try:
            rows = json.loads(stored)
            runs, at = [], 0
            for length, source, step, batch in rows:
                if not isinstance(length, int) or length <= 0 or not isinstance(source, str):
                    return None
                runs.append(Run(text[at : at + length], source, int(step), int(batch)))
                at += length
        except (ValueError, TypeError):
            return None
        return cls(runs) if at == len(text) else None
