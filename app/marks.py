"""How each piece of a reply came: the model's own token of a step, or a verified draft token and its source.

Built from the step events as a reply streams (``TokenMarks.observe``), kept
with the message (``to_json``) and shown by the chat when View → Show lookahead
is on. Consecutive tokens of one step from one source form a run; the runs'
texts join to the reply's text exactly. No Qt here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine import OWN, DraftOrigin, StepEvent

# What each source is called in the legend and the tooltips, in the legend's order.
SOURCE_NAMES = {
    OWN: "the model's own token",
    DraftOrigin.PROMPT: "drafted from the prompt",
    DraftOrigin.DOCUMENT: "drafted from attached files",
    DraftOrigin.REPLY: "drafted from this reply",
    DraftOrigin.HISTORY: "drafted from left-out turns or the text being regenerated",
    DraftOrigin.OTHER_CHATS: "drafted from earlier chats",
    DraftOrigin.KEPT: "drafted from the n-gram pool",
    DraftOrigin.WINDOW: "drafted by the Jacobi window",
}
SHORT_NAMES = {
    OWN: "model's own",
    DraftOrigin.PROMPT: "prompt",
    DraftOrigin.DOCUMENT: "attached files",
    DraftOrigin.REPLY: "this reply",
    DraftOrigin.HISTORY: "earlier text",
    DraftOrigin.OTHER_CHATS: "earlier chats",
    DraftOrigin.KEPT: "n-gram pool",
    DraftOrigin.WINDOW: "Jacobi window",
}


@dataclass
class Run:
    """Text that came the same way in one forward pass."""

    text: str
    source: str  # OWN or a StepEvent.draft_origin
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


# How far ahead a piece of rendered text is looked for in the source after Markdown syntax (a link's address, a
# fence's language): far enough for any syntax, near enough that a common word does not match a later one.
_RESUME_WINDOW = 2048
_ANCHOR = 12  # characters of rendered text that must match where the source resumes


def rendered_positions(source: str, rendered: str) -> list[int]:
    """For each character of ``rendered`` (Markdown as shown), the index in ``source`` it shows, or -1."""
    out = [-1] * len(rendered)
    for at, i, length in aligned_pieces(source, rendered):
        out[at : at + length] = range(i, i + length)
    return out


def aligned_pieces(source: str, rendered: str) -> list[tuple[int, int, int]]:
    """The pieces of ``rendered`` (Markdown as shown) that show ``source`` as written: (at, index in source, length).

    Markdown drops its syntax (``**``, fences, list markers, link addresses) and turns
    line ends into breaks, but keeps the order of the text. So the two texts are walked
    together: equal stretches (and any whitespace against any) pair up; where they differ
    the source holds syntax, skipped up to the next place the rendered text resumes.
    Rendered characters no source character shows (a list's break, an entity's glyph)
    are in no piece. Equal stretches are compared whole, so a long reply costs little.
    """
    pieces: list[tuple[int, int, int]] = []

    def pair(at: int, i: int, length: int) -> None:
        if pieces and pieces[-1][0] + pieces[-1][2] == at and pieces[-1][1] + pieces[-1][2] == i:
            pieces[-1] = (pieces[-1][0], pieces[-1][1], pieces[-1][2] + length)
        else:
            pieces.append((at, i, length))

    i = j = 0
    while i < len(source) and j < len(rendered):
        s, r = source[i], rendered[j]
        if s == r:
            length = _common_length(source, i, rendered, j)
            pair(j, i, length)
            i += length
            j += length
        elif s.isspace() and r.isspace():
            pair(j, i, 1)
            i += 1
            j += 1
        elif s.isspace():  # an indent or a line end Markdown swallowed
            i += 1
        else:
            k = _resume(source, i, rendered, j)
            if k < 0:
                j += 1  # shown from no source character as written (a break between blocks, an entity's glyph)
            else:
                i = k
    return pieces


def _common_length(a: str, i: int, b: str, j: int) -> int:
    """How many characters ``a[i:]`` and ``b[j:]`` share at their start (at least 1: the caller saw one)."""
    # Gallop out, then halve back: a few slice comparisons rather than a Python loop per character.
    limit = min(len(a) - i, len(b) - j)
    low, step = 1, 16
    while low < limit:
        probe = min(limit, low + step)
        if a[i : i + probe] != b[j : j + probe]:
            high = probe - 1
            break
        low, step = probe, step * 2
    else:
        return low
    while low < high:
        middle = (low + high + 1) // 2
        if a[i : i + middle] == b[j : j + middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _resume(source: str, i: int, rendered: str, j: int) -> int:
    """Where in ``source`` (from ``i``) the rendered text at ``j`` goes on, or -1 if it is nowhere near."""
    line_end = rendered.find("\n", j)
    anchor = rendered[j : min(j + _ANCHOR, line_end if line_end >= 0 else len(rendered))]
    for length in dict.fromkeys((len(anchor), 3, 1)):  # a shorter anchor if syntax also sits inside the line
        if 0 < length <= len(anchor):
            window = _RESUME_WINDOW if length > 1 else 16  # a single character only close by
            k = source.find(anchor[:length], i, i + window)
            if k >= 0:
                return k
    return -1


def rendered_spans(runs: list[Run], pieces: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Where each run shows: (rendered start, end, run index), in order, from ``aligned_pieces``."""
    spans: list[tuple[int, int, int]] = []
    run_ends, at = [], 0
    for run in runs:
        at += len(run.text)
        run_ends.append(at)
    k = 0
    for shown, i, length in pieces:
        end = i + length
        while i < end and k < len(run_ends):
            while k < len(run_ends) and i >= run_ends[k]:
                k += 1
            if k == len(run_ends):
                break
            stop = min(end, run_ends[k])
            first, last = shown + i - (end - length), shown + stop - (end - length)
            if spans and spans[-1][1] == first and spans[-1][2] == k:
                spans[-1] = (spans[-1][0], last, k)  # one run across pieces that meet
            else:
                spans.append((first, last, k))
            i = stop
    return spans
