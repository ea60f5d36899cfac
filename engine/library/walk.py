"""Scanning the library's folders for GGUF files, and the header cache that makes a second scan fast.

``scan`` walks the roots with ``os.scandir``, reads each file's header with ``check_gguf`` (never the weights),
and keeps the facts in a JSON cache keyed by (path, size, mtime), so a second scan only stats the files.
Directories are remembered by (st_dev, st_ino): a symlink loop ends where it starts, and a file reached twice is
listed once.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.files import cache_root, file_identity, write_json_atomic
from engine.library.folders import KIND_FILE, KIND_HF, KIND_OLLAMA, SOURCE_USER, LibraryRoot
from engine.library.names import (
    NOT_A_LANGUAGE_MODEL,
    NOT_A_LANGUAGE_MODEL_PLAIN,
    LookaheadKind,
    friendly_name,
    lookahead_block_reason,
    lookahead_kind,
)
from engine.llama.models import GgufSummary, check_gguf
from engine.llama.problems import LoadProblem, ModelFileError, explain

CACHE_VERSION = 2  # bump when the facts kept per file change
MAX_DEPTH = 16  # folders deeper than this under a root are not walked
MAX_MANIFEST_BYTES = 1 << 20  # an Ollama manifest is a few hundred bytes
_OLLAMA_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
OLLAMA_DEFAULT_REGISTRY = "registry.ollama.ai"
OLLAMA_DEFAULT_NAMESPACE = "library"


@dataclass(frozen=True)
class LibraryModel:
    """One GGUF file found: its facts from the header, or why it cannot be used (``error``)."""

    path: str
    name: str
    source: str
    size_bytes: int
    summary: GgufSummary | None = None
    error: str | None = None  # technical: what the header check said, with the path
    problem: str | None = None  # the same in plain words, for a person

    @property
    def ok(self) -> bool:
        return self.error is None and self.summary is not None

    @property
    def architecture(self) -> str:
        return self.summary.architecture if self.summary else ""

    @property
    def n_params(self) -> int:
        return self.summary.n_params if self.summary else 0

    @property
    def file_type(self) -> str:
        return self.summary.file_type if self.summary else ""

    @property
    def context_length(self) -> int | None:
        return self.summary.context_length if self.summary else None

    @property
    def has_chat_template(self) -> bool:
        return bool(self.summary and self.summary.has_chat_template)

    @property
    def lookahead_block_reason(self) -> str | None:
        """Why lookahead cannot run with this model (None when it can); a broken file cannot run at all."""
        if not self.ok:
            return "the file cannot be loaded"
        return lookahead_block_reason(self.architecture)

    @property
    def can_lookahead(self) -> bool:
        return self.lookahead_block_reason is None

    @property
    def lookahead_kind(self) -> LookaheadKind:
        return lookahead_kind(self.architecture) if self.ok else LookaheadKind.PLAIN

    def to_json(self) -> dict[str, object]:
        """The row ``lookahead-chat --list-models --json`` prints."""
        return {
            "path": self.path,
            "name": self.name,
            "architecture": self.architecture or None,
            "parameters": self.n_params or None,
            "quantization": self.file_type or None,
            "size_bytes": self.size_bytes,
            "context_length": self.context_length,
            "chat_template": self.has_chat_template if self.ok else None,
            "lookahead": self.can_lookahead,
            "lookahead_kind": self.lookahead_kind,
            "source": self.source,
            "error": self.error,
        }


@dataclass(frozen=True)
class SkippedFile:
    """A file or folder the scan could not read, and why."""

    path: str
    reason: str
    source: str


@dataclass
class SearchedFolder:
    """A root the scan looked in: whether it is on this PC, and how many models (usable or not) it held."""

    path: str
    source: str
    kind: str
    exists: bool
    models: int = 0


@dataclass
class ScanResult:
    """What a scan found: usable and broken models, what it skipped, the roots it searched, and whether it
    was cancelled (roots not reached by then are not in ``searched``)."""

    models: list[LibraryModel] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    searched: list[SearchedFolder] = field(default_factory=list)
    cancelled: bool = False
    files_seen: int = 0
    seconds: float = 0.0


class ScanCancelled(Exception):
    """The cancel event was set; the scan stops between two files."""


def cache_path() -> Path:
    return cache_root() / "library" / "headers.json"


class HeaderCache:
    """Header facts (or the error) per file, valid while the file's identity (``file_identity``) stays the same."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_path()
        self.entries: dict[str, dict[str, object]] = {}
        self.changed = False
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(raw, dict) and raw.get("version") == CACHE_VERSION and isinstance(raw.get("entries"), dict):
            self.entries = {k: v for k, v in raw["entries"].items() if isinstance(v, dict)}

    def get(self, path: str, st: os.stat_result) -> GgufSummary | LoadProblem | None:
        """The cached summary or problem for this file as it is now; None if unknown or changed."""
        entry = self.entries.get(path)
        if entry is None or entry.get("file") != file_identity(path, st):
            return None
        error, message = entry.get("error"), entry.get("message")
        if isinstance(error, str):
            plain = message if isinstance(message, str) else explain(error)[1]  # kept by an older version
            return LoadProblem(plain, error)
        facts = entry.get("summary")
        if not isinstance(facts, dict):
            return None
        try:
            return GgufSummary(**facts)
        except TypeError:  # written by another version of GgufSummary
            return None

    def put(self, path: str, st: os.stat_result, result: GgufSummary | LoadProblem) -> None:
        entry: dict[str, object] = {"file": file_identity(path, st)}
        if isinstance(result, LoadProblem):
            entry["error"], entry["message"] = result.detail, result.message
        else:
            entry["summary"] = asdict(result)
        self.entries[path] = entry
        self.changed = True

    def save(self) -> None:
        """Write atomically (a crash mid-write leaves the old cache); failures only cost a slower next scan."""
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, {"version": CACHE_VERSION, "entries": self.entries})
            self.changed = False
        except OSError:
            pass


Progress = Callable[[int, str], None]  # (files looked at so far, the file now)


@dataclass(frozen=True)
class _Candidate:
    """A file that should be a GGUF model: where it was found, and the name to show for it."""

    path: str
    name: str | None
    source: str


class _Walk:
    """Directory walking shared by every layout: visited folders, skipped notes, cancellation."""

    def __init__(self, result: ScanResult, cancel: threading.Event | None) -> None:
        self.result = result
        self.cancel = cancel
        self.visited: set[tuple[int, int]] = set()

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise ScanCancelled

    def skip(self, path: str, reason: str, source: str) -> None:
        self.result.skipped.append(SkippedFile(path, reason, source))

    def entries(self, folder: str, source: str) -> Iterator[os.DirEntry[str]]:
        """The entries of ``folder``, sorted by name; nothing (and a note) if it cannot be read."""
        try:
            with os.scandir(folder) as it:
                found = sorted(it, key=lambda e: e.name)
        except PermissionError:
            self.skip(folder, "the folder cannot be opened (permission denied)", source)
            return
        except OSError as exc:
            self.skip(folder, f"the folder cannot be read ({exc.strerror or exc})", source)
            return
        yield from found

    def enter(self, path: str, source: str, ancestors: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
        """The folder's identity if it is to be walked now; None if seen already (a loop is noted)."""
        try:
            st = os.stat(path)
        except OSError as exc:
            self.skip(path, f"the folder cannot be read ({exc.strerror or exc})", source)
            return None
        key = (st.st_dev, st.st_ino)
        if key in ancestors:
            self.skip(path, "a symlink loop: it links back to a folder that contains it", source)
            return None
        if key in self.visited:
            return None  # the same folder by a second path: its files are listed once
        self.visited.add(key)
        return key

    def tree(
        self, folder: str, source: str, suffix: str = ".gguf", ancestors: tuple[tuple[int, int], ...] = (),
    ) -> Iterator[str]:
        """Files under ``folder`` whose names end with ``suffix`` (any case), depth first, in name order."""
        key = self.enter(folder, source, ancestors)
        if key is None:
            return
        if len(ancestors) >= MAX_DEPTH:
            self.skip(folder, f"more than {MAX_DEPTH} folders deep: not scanned further", source)
            return
        inside = ancestors + (key,)
        for entry in self.entries(folder, source):
            self.check_cancel()
            try:
                is_dir = entry.is_dir()  # follows symlinks; a dangling link is neither file nor folder
                is_file = not is_dir and entry.is_file()
            except OSError:
                continue
            if is_dir:
                yield from self.tree(entry.path, source, suffix, inside)
            elif is_file and entry.name.lower().endswith(suffix):
                yield entry.path


def _tree_candidates(walk: _Walk, root: LibraryRoot) -> Iterator[_Candidate]:
    for path in walk.tree(root.path, root.source):
        yield _Candidate(path, None, root.source)


def _hf_candidates(walk: _Walk, root: LibraryRoot) -> Iterator[_Candidate]:
    """GGUF files in the hub cache's model snapshots, named "org/repo/file" (the way the hub names them)."""
    for repo in walk.entries(root.path, root.source):
        walk.check_cancel()
        if not repo.name.startswith("models--"):
            continue
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        snapshots = os.path.join(repo.path, "snapshots")
        if not os.path.isdir(snapshots):
            continue
        try:  # the revision "main" points to first: a blob that several revisions link to is listed as main's
            main = Path(repo.path, "refs", "main").read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            main = ""
        revisions = sorted(e.name for e in walk.entries(snapshots, root.source))
        for revision in sorted(revisions, key=lambda r: r != main):
            folder = os.path.join(snapshots, revision)
            for path in walk.tree(folder, root.source):
                rel = Path(os.path.relpath(path, folder)).parts
                yield _Candidate(path, f"{repo_id}/{'/'.join(rel)}", root.source)


def _ollama_name(parts: tuple[str, ...]) -> str:
    """A manifest's path (host, namespace, model, tag) as ``ollama list`` shows it."""
    host, namespace, model, tag = parts
    if host == OLLAMA_DEFAULT_REGISTRY:
        return f"{model}:{tag}" if namespace == OLLAMA_DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _ollama_candidates(walk: _Walk, root: LibraryRoot) -> Iterator[_Candidate]:
    """The model blob each Ollama manifest names, under the model's Ollama name."""
    manifests = os.path.join(root.path, "manifests")
    if not os.path.isdir(manifests):
        return
    for manifest in walk.tree(manifests, root.source, suffix=""):
        parts = Path(os.path.relpath(manifest, manifests)).parts
        if len(parts) != 4:
            continue
        try:
            if os.path.getsize(manifest) > MAX_MANIFEST_BYTES:
                raise ValueError("too large")
            with open(manifest, encoding="utf-8") as fh:
                layers = json.load(fh).get("layers", [])
            digests = [la["digest"] for la in layers if la.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE]
        except PermissionError:
            walk.skip(manifest, "the manifest cannot be opened (permission denied)", root.source)
            continue
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:
            walk.skip(manifest, f"not an Ollama manifest ({exc})", root.source)
            continue
        for digest in digests:
            # A digest names a file inside blobs/ and nothing else: "sha256:" and 64 hex digits, no path.
            if not isinstance(digest, str) or not _OLLAMA_DIGEST.fullmatch(digest):
                walk.skip(manifest, f"its model layer has an unknown digest {digest!r}", root.source)
                continue
            blobs = os.path.join(root.path, "blobs")
            path = os.path.join(blobs, digest.replace(":", "-"))
            if not os.path.exists(path) and os.path.exists(os.path.join(blobs, digest)):
                path = os.path.join(blobs, digest)
            if not os.path.exists(path):
                walk.skip(manifest, f"its model blob is missing ({path})", root.source)
                continue
            yield _Candidate(path, _ollama_name(parts), root.source)


def _candidates(walk: _Walk, root: LibraryRoot) -> Iterator[_Candidate]:
    if root.kind == KIND_FILE:
        yield _Candidate(root.path, None, root.source)
    elif not os.path.isdir(root.path):
        if root.source == SOURCE_USER:  # an app's folder may well be absent; one the user added should not be
            walk.skip(root.path, "the folder does not exist (or is not a folder)", root.source)
        return
    elif root.kind == KIND_HF:
        yield from _hf_candidates(walk, root)
    elif root.kind == KIND_OLLAMA:
        yield from _ollama_candidates(walk, root)
    else:
        yield from _tree_candidates(walk, root)


class _Unreadable(Exception):
    """The file cannot be opened now: a note for this scan, not an answer to keep in the cache."""


def _read_facts(path: str) -> GgufSummary | LoadProblem:
    """The file's header facts, or why it is not a usable model; raises _Unreadable."""
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        raise _Unreadable("the file cannot be opened (permission denied)") from None
    except OSError as exc:
        raise _Unreadable(f"the file cannot be read ({exc.strerror or exc})") from None
    try:
        summary = check_gguf(path)
    except ModelFileError as exc:
        return LoadProblem.from_exception(exc)
    refused = NOT_A_LANGUAGE_MODEL.get(summary.architecture)
    if refused:
        return LoadProblem(NOT_A_LANGUAGE_MODEL_PLAIN, f"{refused}: {path}")
    return summary


def scan(
    roots: Iterable[LibraryRoot],
    cancel: threading.Event | None = None,
    progress: Progress | None = None,
    cache: HeaderCache | None = None,
) -> ScanResult:
    """Find the GGUF models under ``roots``, with their header facts; cancellable between any two files.

    Unreadable files and folders, symlink loops and bad Ollama manifests become ``skipped`` notes;
    files that are readable but not usable GGUF models are listed with their ``error``. A file reached
    by two paths (a second revision's link to the same blob, overlapping folders) is listed once.
    """
    t0 = time.perf_counter()
    result = ScanResult()
    cache = cache if cache is not None else HeaderCache()
    walk = _Walk(result, cancel)
    seen_files: set[tuple[int, int]] = set()
    try:
        for root in roots:
            walk.check_cancel()
            exists = os.path.isfile(root.path) if root.kind == KIND_FILE else os.path.isdir(root.path)
            searched = SearchedFolder(root.path, root.source, root.kind, exists)
            result.searched.append(searched)
            for cand in _candidates(walk, root):
                walk.check_cancel()
                result.files_seen += 1
                if progress is not None:
                    progress(result.files_seen, cand.path)
                model = _examine(cand, cache, walk, seen_files)
                if model is not None:
                    result.models.append(model)
                    searched.models += 1
    except ScanCancelled:
        result.cancelled = True
    cache.save()
    result.seconds = time.perf_counter() - t0
    return result


def _examine(
    cand: _Candidate, cache: HeaderCache, walk: _Walk, seen_files: set[tuple[int, int]],
) -> LibraryModel | None:
    try:
        st = os.stat(cand.path)
    except OSError as exc:
        walk.skip(cand.path, f"the file cannot be read ({exc.strerror or exc})", cand.source)
        return None
    key = (st.st_dev, st.st_ino)
    if key in seen_files or not stat.S_ISREG(st.st_mode):
        return None
    seen_files.add(key)
    if not os.access(cand.path, os.R_OK):  # checked every time: chmod changes no size or mtime
        walk.skip(cand.path, "the file cannot be opened (permission denied)", cand.source)
        return None
    facts = cache.get(cand.path, st)
    if facts is None:
        try:
            facts = _read_facts(cand.path)
        except _Unreadable as exc:
            walk.skip(cand.path, str(exc), cand.source)
            return None
        cache.put(cand.path, st, facts)
    if isinstance(facts, LoadProblem):
        name = cand.name or Path(cand.path).name
        return LibraryModel(cand.path, name, cand.source, st.st_size, None, facts.detail, facts.message)
    # Hugging Face and Ollama give their own names ("org/repo/file", "model:tag"); others get the file's
    # friendly name, the one the status bar shows once it is loaded.
    return LibraryModel(cand.path, cand.name or friendly_name(facts.name, cand.path), cand.source, st.st_size, facts)
