"""Attached documents: their text, read within limits, and the part of them a question is given.

Reading (``read_document``): plain text in any encoding charset-normalizer
recognises, Markdown, source code, CSV, JSON, HTML (its text, never its
markup), PDF (pypdf) and DOCX (python-docx). Every read has a size limit, a
time limit and a cancel event, and every way a file can be unusable ends in a
``DocumentError`` whose message names the file and says why in plain words.

Fitting (``DocumentContext.build``): when the documents fit the room the
prompt has for them, they go in whole; otherwise they are cut into chunks
(``chunk_document``), indexed with SQLite FTS5 (BM25 ranking, in memory), and
the chunks that best match the question go in, in document order. Either way
the result says what each file contributes (``coverage``) and which passages
the model was given (``citations``).

Drafting from documents is the engine's (``Engine.set_documents``): it indexes
every attached document in full, the chunks left out of the prompt too.

No Qt here.
"""

from __future__ import annotations

import html.parser
import logging
import re
import sqlite3
import threading
import time
import warnings
import zipfile
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.units import plain_size

TEXT_SUFFIXES = {
    ".txt": "text", ".text": "text", ".log": "text", ".rst": "text", ".md": "markdown", ".markdown": "markdown",
    ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".html": "html", ".htm": "html",
}
CODE_SUFFIXES = {
    ".py", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".kt", ".js", ".ts", ".tsx", ".jsx", ".rb",
    ".php", ".cs", ".swift", ".sh", ".bash", ".ps1", ".sql", ".toml", ".yaml", ".yml", ".ini", ".cfg", ".xml",
    ".css", ".scss", ".lua", ".r", ".m", ".scala", ".pl", ".hs", ".ex", ".exs", ".dart", ".cmake", ".mk",
}
# What a file picker offers: every kind ``read_document`` reads.
SUPPORTED_SUFFIXES = tuple(sorted({*TEXT_SUFFIXES, *CODE_SUFFIXES, ".pdf", ".docx"}))


@dataclass(frozen=True)
class ReadLimits:
    """How much a document may cost to read. A file over a limit is refused, not cut."""

    max_file_bytes: int = 64 * 1024 * 1024  # on disk
    max_chars: int = 4_000_000  # of extracted text (~1M tokens: far more than any context, enough to draft from)
    max_seconds: float = 60.0  # to extract it
    max_unpacked_bytes: int = 256 * 1024 * 1024  # a DOCX's members, unpacked
    max_pack_ratio: float = 100.0  # unpacked / packed size of one DOCX member: more is a ZIP bomb


class DocumentError(Exception):
    """A document that cannot be used: ``str()`` names the file and the reason in plain words."""

    def __init__(self, name: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason
        self.detail = detail  # the technical cause, for a "details" view


class ReadCancelled(Exception):
    """The read was cancelled (its cancel event was set)."""


@dataclass(frozen=True)
class Document:
    """One attached file's text, with where its pages start (PDF) so a passage can be located."""

    name: str
    kind: str  # "text", "markdown", "code", "csv", "json", "html", "pdf", "docx"
    size_bytes: int
    text: str
    page_starts: tuple[int, ...] = ()  # character offset of each page's first character (PDF only)
    encoding: str = ""  # of a text file

    @property
    def pages(self) -> int:
        return len(self.page_starts)

    def where(self, start: int, end: int) -> str:
        """Where ``text[start:end]`` is, as a reader finds it: "page 3", "pages 3–4" or "lines 10–42"."""
        end = max(end - 1, start)
        if self.page_starts:
            a, b = (bisect_right(self.page_starts, i) for i in (start, end))
            return f"page {a}" if a == b else f"pages {a}–{b}"
        a, b = (self.text.count("\n", 0, i) + 1 for i in (start, end))
        return f"line {a}" if a == b else f"lines {a}–{b}"


def kind_of(path: Path) -> str:
    """The kind of document ``path`` holds, by its name ("" = not one we read)."""
    suffix = path.suffix.lower()
    if suffix in (".pdf", ".docx"):
        return suffix[1:]
    if suffix in TEXT_SUFFIXES:
        return TEXT_SUFFIXES[suffix]
    if suffix in CODE_SUFFIXES or path.name in ("Makefile", "Dockerfile", "CMakeLists.txt"):
        return "code"
    return ""


def read_document(
    path: str | Path,
    limits: ReadLimits = ReadLimits(),
    cancel: threading.Event | None = None,
    progress: Callable[[float], None] | None = None,
) -> Document:
    """Read ``path``'s text; raises ``DocumentError`` (with the reason) or ``ReadCancelled``.

    A file with an unknown suffix is read as text if it is text. ``progress``
    hears 0..1 as the pages of a long PDF are read.
    """
    p = Path(path)
    name = p.name
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise DocumentError(name, "the file is no longer there (moved or deleted)") from None
    except OSError as exc:
        raise DocumentError(name, "the file cannot be read", str(exc)) from exc
    if not p.is_file():
        raise DocumentError(name, "this is not a file")
    if size > limits.max_file_bytes:
        raise DocumentError(name, f"the file is too big ({plain_size(size)}; files up to "
                                  f"{plain_size(limits.max_file_bytes)} can be attached)")
    deadline = time.monotonic() + limits.max_seconds
    kind = kind_of(p) or "text"
    try:
        if kind == "pdf":
            text, pages = _read_pdf(p, name, deadline, cancel, progress)
            doc = Document(name, kind, size, text, pages)
        elif kind == "docx":
            doc = Document(name, kind, size, _read_docx(p, name, limits))
        else:
            text, encoding = _read_text(p, name)
            if kind == "html":
                text = html_text(text)
            doc = Document(name, kind, size, text, encoding=encoding)
    except OSError as exc:
        if not p.exists():
            raise DocumentError(name, "the file is no longer there (moved or deleted)") from None
        raise DocumentError(name, "the file cannot be read", str(exc)) from exc
    if len(doc.text) > limits.max_chars:
        raise DocumentError(name, f"it holds too much text ({len(doc.text):,} characters; up to "
                                  f"{limits.max_chars:,} can be attached)")
    if not doc.text.strip():
        what = "its pages hold no text (a scanned PDF needs text recognition first)" if kind == "pdf" else \
            "it holds no text"
        raise DocumentError(name, what)
    return doc


def _read_text(p: Path, name: str) -> tuple[str, str]:
    """A text file's text and its encoding: UTF-8 (with or without BOM) first, else what charset-normalizer finds."""
    data = p.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16"), "utf-16"
        except UnicodeDecodeError:
            pass
    if b"\x00" in data[:8192]:
        raise DocumentError(name, "this is not a text file (it holds binary data)")
    try:
        return data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes  # only for files that are not UTF-8

    best = from_bytes(data[:1_000_000]).best()
    if best is None or best.encoding is None:
        raise DocumentError(name, "its text encoding could not be recognised (save it as UTF-8 and attach it again)")
    try:
        return data.decode(best.encoding), best.encoding
    except (UnicodeDecodeError, LookupError) as exc:
        raise DocumentError(name, "its text encoding could not be recognised (save it as UTF-8 and attach it "
                                  "again)", str(exc)) from exc


def _read_pdf(
    p: Path, name: str, deadline: float, cancel: threading.Event | None, progress: Callable[[float], None] | None,
) -> tuple[str, tuple[int, ...]]:
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError, PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a damaged page is our message to give, not a log line
    parts: list[str] = []
    starts: list[int] = []
    offset = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reader = PdfReader(p)
            if reader.is_encrypted:
                try:
                    if not reader.decrypt(""):  # many "protected" PDFs only restrict printing: an empty user password
                        raise DocumentError(name, "this PDF is protected by a password")
                except (FileNotDecryptedError, NotImplementedError, DependencyError) as exc:  # AES without a crypto lib
                    raise DocumentError(name, "this PDF is protected by a password", str(exc)) from exc
            pages = reader.pages
            n = len(pages)
            for i in range(n):
                if cancel is not None and cancel.is_set():
                    raise ReadCancelled(name)
                if time.monotonic() > deadline:
                    raise DocumentError(name, f"reading it took too long (stopped at page {i + 1} of {n})")
                text = (pages[i].extract_text() or "").strip()
                starts.append(offset)
                parts.append(text)
                offset += len(text) + 2
                if progress is not None:
                    progress((i + 1) / n)
        except (DocumentError, ReadCancelled):
            raise
        except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError,
                RecursionError, AssertionError, ZeroDivisionError) as exc:
            raise DocumentError(name, "this PDF is damaged or not a PDF", f"{type(exc).__name__}: {exc}") from exc
    return "\n\n".join(parts), tuple(starts)


def _read_docx(p: Path, name: str, limits: ReadLimits) -> str:
    """A Word document's paragraphs and tables, in order; its ZIP is checked before anything is unpacked."""
    try:
        with zipfile.ZipFile(p) as zf:
            infos = zf.infolist()
            unpacked = sum(i.file_size for i in infos)
            worst = max((i.file_size / max(i.compress_size, 1) for i in infos), default=0.0)
            names = {i.filename for i in infos}
    except zipfile.BadZipFile as exc:
        raise DocumentError(name, "this Word document is damaged or not a DOCX file", str(exc)) from exc
    if unpacked > limits.max_unpacked_bytes or worst > limits.max_pack_ratio:
        raise DocumentError(name, f"this file unpacks to {plain_size(unpacked)} (a ZIP bomb?); it was not opened")
    if "word/document.xml" not in names:
        raise DocumentError(name, "this is a ZIP archive, not a Word document")
    import docx
    from docx.oxml.ns import qn

    try:
        document = docx.Document(str(p))
    except Exception as exc:  # python-docx raises lxml, KeyError and its own errors for a damaged file
        raise DocumentError(name, "this Word document is damaged", f"{type(exc).__name__}: {exc}") from exc
    lines: list[str] = []
    for block in document.element.body.iterchildren():
        if block.tag == qn("w:p"):
            lines.append("".join(t.text or "" for t in block.iter(qn("w:t"))))
        elif block.tag == qn("w:tbl"):
            for row in block.iter(qn("w:tr")):
                cells = ("".join(t.text or "" for t in cell.iter(qn("w:t"))) for cell in row.iter(qn("w:tc")))
                lines.append(" | ".join(cells))
    return "\n".join(lines).strip()


class _HtmlText(html.parser.HTMLParser):
    LINES = {"br", "li", "tr"}  # a new line before
    BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section", "article",
              "table", "ul", "ol", "blockquote", "hr", "header", "footer"}
    SKIP = {"script", "style", "template", "noscript", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skipping += 1
        elif tag in self.BLOCKS or tag in self.LINES:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self._skipping = max(self._skipping - 1, 0)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_text(markup: str) -> str:
    """The text a browser would show of ``markup`` (no scripts, styles or tags), with block breaks kept."""
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    text = re.sub(r"[ \t\r\f\v]+", " ", "".join(parser.parts))
    return re.sub(r"\n\s*\n+", "\n\n", "\n".join(line.strip() for line in text.split("\n"))).strip()


# --- chunks and retrieval ---


@dataclass(frozen=True)
class Chunk:
    """A passage of a document: ``document.text[start:end]``."""

    doc: int  # index of its document
    start: int
    end: int
    text: str


def chunk_document(doc: Document, index: int = 0, size: int = 1200, overlap: int = 200) -> list[Chunk]:
    """``doc``'s text as passages of about ``size`` characters, cut at line ends where possible, overlapping a little.

    The overlap keeps a sentence cut at a boundary whole in one of the two passages.
    """
    text, n = doc.text, len(doc.text)
    out: list[Chunk] = []
    start = 0
    while start < n:
        end = min(start + size, n)
        if end < n:  # prefer a paragraph break, then a line break, then a space, in the passage's second half
            for sep in ("\n\n", "\n", ". ", " "):
                cut = text.rfind(sep, start + size // 2, end)
                if cut > 0:
                    end = cut + len(sep)
                    break
        out.append(Chunk(index, start, end, text[start:end]))
        if end >= n:
            break
        start = max(end - overlap, start + 1)
        space = text.find(" ", start, end)  # start the next passage at a word
        if 0 <= space < end - 1 and space - start < overlap // 2:
            start = space + 1
    return out


WORD = re.compile(r"\w+", re.UNICODE)


def fts_strings(words: Iterable[str]) -> list[str]:
    """``words`` (runs of ``WORD``) as FTS5 strings: each quoted, so none of them is read as FTS5 syntax."""
    return [f'"{w}"' for w in words]


def fts_query(question: str) -> str:
    """An FTS5 query matching any of the question's words."""
    return " OR ".join(fts_strings(sorted({w.lower() for w in WORD.findall(question) if len(w) > 1 or w.isdigit()})))


class ChunkIndex:
    """The documents' passages in an in-memory SQLite FTS5 table, ranked by BM25 for a question."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.chunks = list(chunks)
        self._db = sqlite3.connect(":memory:")
        self._db.execute("CREATE VIRTUAL TABLE passages USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
        self._db.executemany("INSERT INTO passages(rowid, body) VALUES (?, ?)",
                             ((i, c.text) for i, c in enumerate(self.chunks)))

    def best(self, question: str, limit: int = 50) -> list[int]:
        """Indices of the passages that best match ``question``, best first ([] when no word matches)."""
        query = fts_query(question)
        if not query:
            return []
        rows = self._db.execute(
            "SELECT rowid FROM passages WHERE passages MATCH ? ORDER BY bm25(passages) LIMIT ?", (query, limit)
        )
        return [int(r[0]) for r in rows]

    def close(self) -> None:
        self._db.close()


@dataclass(frozen=True)
class Citation:
    """A passage the model was given: its file, where it is, and its text."""

    name: str
    where: str
    text: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "where": self.where, "text": self.text}


@dataclass(frozen=True)
class DocumentContext:
    """What of the attached documents goes in the prompt, and what that leaves out.

    ``coverage`` maps each file's name to the fraction of its text in the
    prompt (1.0 = whole); ``whole`` is true when every file fits whole.
    """

    text: str
    citations: tuple[Citation, ...] = ()
    coverage: dict[str, float] = field(default_factory=dict)
    whole: bool = True
    tokens: int = 0

    @classmethod
    def build(
        cls, docs: Sequence[Document], question: str, budget_tokens: int, count_tokens: Callable[[str], int],
    ) -> DocumentContext:
        """The documents in ``budget_tokens``: whole if they fit, else the passages that best match ``question``."""
        if not docs:
            return cls("")
        whole = _format(docs, [[(0, len(d.text))] for d in docs])
        n_whole = count_tokens(whole)
        if n_whole <= budget_tokens:
            return cls(whole, tuple(Citation(d.name, _whole_where(d), d.text) for d in docs),
                       {d.name: 1.0 for d in docs}, True, n_whole)
        chunks = [c for i, d in enumerate(docs) for c in chunk_document(d, i)]
        index = ChunkIndex(chunks)
        try:
            ranked = index.best(question, limit=len(chunks))
        finally:
            index.close()
        # Passages no word of the question matched follow, each document's beginning first: a question like
        # "summarise this" still gets the start of every file.
        order = ranked + sorted(set(range(len(chunks))) - set(ranked), key=lambda i: (chunks[i].start, chunks[i].doc))
        chosen: list[int] = []
        used = count_tokens(_format(docs, [[] for _ in docs]))
        for i in order:
            cost = count_tokens(chunks[i].text) + 8  # + the passage's heading
            if used + cost > budget_tokens:
                continue
            chosen.append(i)
            used += cost
        chosen.sort(key=lambda i: (chunks[i].doc, chunks[i].start))
        spans: list[list[tuple[int, int]]] = [[] for _ in docs]
        for i in chosen:
            c = chunks[i]
            if spans[c.doc] and c.start <= spans[c.doc][-1][1]:  # overlapping neighbours read as one passage
                spans[c.doc][-1] = (spans[c.doc][-1][0], max(c.end, spans[c.doc][-1][1]))
            else:
                spans[c.doc].append((c.start, c.end))
        text = _format(docs, spans)
        citations = tuple(Citation(d.name, d.where(a, b), d.text[a:b]) for d, ss in zip(docs, spans, strict=True)
                          for a, b in ss)
        coverage = {d.name: sum(b - a for a, b in ss) / max(len(d.text), 1) for d, ss in zip(docs, spans, strict=True)}
        return cls(text, citations, coverage, False, count_tokens(text))


def _whole_where(doc: Document) -> str:
    if doc.page_starts:
        return "whole file" if doc.pages > 1 else "page 1"
    return "whole file"


def _format(docs: Sequence[Document], spans: Sequence[Sequence[tuple[int, int]]]) -> str:
    """The documents' passages as the prompt shows them: a heading per file, each passage located."""
    out: list[str] = []
    for doc, ss in zip(docs, spans, strict=True):
        whole = len(ss) == 1 and ss[0] == (0, len(doc.text))
        head = f"Attached file: {doc.name}" + ("" if whole else f" (excerpts; {len(ss)} of its passages)")
        out.append(f"<<< {head} >>>")
        if not ss and not whole:
            out.append("(no passage of this file matched the question)")
        for a, b in ss:
            if not whole:
                out.append(f"[{doc.where(a, b)}]")
            out.append(doc.text[a:b].strip())
        out.append(f"<<< end of {doc.name} >>>")
    return "\n".join(out)


def with_documents(question: str, context: DocumentContext) -> str:
    """The user's message as the model reads it: the documents' text, then the question."""
    if not context.text:
        return question
    return f"{context.text}\n\n{question}"
