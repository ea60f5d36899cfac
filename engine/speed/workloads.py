"""The prompts a speed measurement runs: the repo's workloads file, a user's own JSONL, or questions about files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.documents import kind_of
from engine.files import DATA_DIR

WORKLOADS_PATH = DATA_DIR / "workloads.jsonl"


@dataclass(frozen=True)
class Workload:
    """One benchmark prompt, sent as a chat message; ``cat`` groups prompts in the roll-up."""

    id: str
    cat: str
    prompt: str
    attach: tuple[str, ...] = ()  # files attached to the message (paths), for the "docs" category
    schema: str = ""  # a JSON schema the reply must match (as JSON text), for structured output


def load_workloads(path: str | Path | None = None) -> list[Workload]:
    """Read a JSONL file of {"id", "cat", "prompt"} (the repo's own by default).

    A line may add "attach": files attached to the message, relative to the JSONL file's folder, and "schema":
    a JSON schema the reply must match.
    """
    p = Path(path) if path else WORKLOADS_PATH
    out: list[Workload] = []
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                attach = tuple(str(p.parent / str(a)) for a in obj.get("attach", ()))
                schema = json.dumps(obj["schema"]) if "schema" in obj else ""
                out.append(Workload(id=str(obj["id"]), cat=str(obj["cat"]), prompt=str(obj["prompt"]), attach=attach,
                                    schema=schema))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{p}:{n}: not a workload line ({exc})") from exc
    if not out:
        raise ValueError(f"{p}: no prompts")
    return out


# What ``bench --attach-dir`` asks about a user's own files when no prompts are given: questions whose answers
# quote the files, as questions about documents do.
ATTACHED_QUESTIONS = (
    ("docs-summary", "Summarise the attached files in a few sentences, naming each file."),
    ("docs-quote", "Quote the first lines of each attached file exactly, then say in one sentence what it is about."),
    ("docs-points", "List the main points of the attached files as bullet points, quoting their words where you can."),
)


def attached_workloads(folder: str | Path, prompts: Sequence[Workload] = ()) -> list[Workload]:
    """Workloads that attach every readable file in ``folder`` (not its subfolders): ``prompts`` if given, else
    ``ATTACHED_QUESTIONS``, all in the "docs" category."""
    files = sorted(str(f) for f in Path(folder).iterdir() if f.is_file() and kind_of(f))
    if not files:
        raise ValueError(f"{folder}: no files to attach (text, Markdown, code, CSV, JSON, HTML, PDF or DOCX)")
    asked = list(prompts) or [Workload(id=i, cat="docs", prompt=q) for i, q in ATTACHED_QUESTIONS]
    return [Workload(id=w.id, cat="docs", prompt=w.prompt, attach=tuple(files)) for w in asked]
