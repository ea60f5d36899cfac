"""Attached documents: reading every kind within limits, refusing bad files with a reason, fit or retrieve."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.documents import (
    ChunkIndex,
    Document,
    DocumentContext,
    DocumentError,
    ReadCancelled,
    ReadLimits,
    chunk_document,
    fts_query,
    read_document,
    with_documents,
)
from tests.helpers.documents_fixtures import make_docx, make_encrypted_pdf, make_pdf, make_zip_bomb


def words(text: str) -> int:
    """A stand-in tokenizer: one token per word."""
    return len(text.split())


# --- reading ---


def test_a_utf8_text_file_and_a_source_file_are_read_as_they_are(tmp_path: Path):
    (tmp_path / "notes.md").write_text("# Notes\n\nCafé au lait — **strong**.\n", encoding="utf-8")
    (tmp_path / "tool.py").write_text("def main():\n    return 42\n", encoding="utf-8")
    notes, tool = read_document(tmp_path / "notes.md"), read_document(tmp_path / "tool.py")
    assert (notes.kind, notes.encoding) == ("markdown", "utf-8")
    assert "Café au lait — **strong**." in notes.text
    assert tool.kind == "code" and tool.text == "def main():\n    return 42\n"


def test_a_text_file_in_another_encoding_is_decoded_by_what_it_holds(tmp_path: Path):
    text = "Der Bär läuft über die Straße. Größe, Übermaß und Äpfel sind schön. " * 20
    (tmp_path / "brief.txt").write_bytes(text.encode("cp1252"))
    doc = read_document(tmp_path / "brief.txt")
    assert doc.text == text
    assert doc.encoding and doc.encoding != "utf-8"


def test_a_utf16_file_with_its_byte_order_mark_is_read(tmp_path: Path):
    (tmp_path / "wide.txt").write_bytes("hello wide world".encode("utf-16"))
    assert read_document(tmp_path / "wide.txt").text == "hello wide world"


def test_html_gives_its_text_never_its_markup_or_scripts(tmp_path: Path):
    (tmp_path / "page.html").write_text(
        "<html><head><title>t</title><style>p{}</style></head><body><h1>Title</h1><p>First &amp; <b>bold</b></p>"
        "<script>alert('x')</script><ul><li>one</li><li>two</li></ul></body></html>", encoding="utf-8")
    text = read_document(tmp_path / "page.html").text
    assert text == "Title\n\nFirst & bold\n\none\ntwo"


def test_a_pdf_gives_its_pages_text_and_a_passage_says_which_page_it_is_on(tmp_path: Path):
    path = make_pdf(tmp_path / "manual.pdf", ["Chapter one\nThe pump starts slowly.", "Chapter two\nValve V7 opens."])
    doc = read_document(path)
    assert doc.kind == "pdf" and doc.pages == 2
    assert "The pump starts slowly." in doc.text and "Valve V7 opens." in doc.text
    at = doc.text.index("Valve V7")
    assert doc.where(at, at + 8) == "page 2"
    assert doc.where(0, len(doc.text)) == "pages 1–2"


def test_a_docx_gives_its_paragraphs_and_tables_in_order(tmp_path: Path):
    path = make_docx(tmp_path / "spec.docx", ["Intro paragraph.", "Second paragraph."], [["key", "value"], ["a", "1"]])
    doc = read_document(path)
    assert doc.text.split("\n") == ["Intro paragraph.", "Second paragraph.", "key | value", "a | 1"]


def test_a_long_pdf_reports_progress_and_stops_when_cancelled(tmp_path: Path):
    path = make_pdf(tmp_path / "long.pdf", [f"Page {i} text" for i in range(40)])
    seen: list[float] = []
    cancel = threading.Event()

    def progress(fraction: float) -> None:
        seen.append(fraction)
        if fraction >= 0.25:
            cancel.set()

    with pytest.raises(ReadCancelled):
        read_document(path, cancel=cancel, progress=progress)
    assert seen == sorted(seen) and 0.25 <= seen[-1] < 0.5


# --- bad files: one clear reason each, naming the file ---


def reason(path: Path, **limits) -> str:
    with pytest.raises(DocumentError) as info:
        read_document(path, ReadLimits(**limits))
    assert str(info.value).startswith(path.name + ": ")
    return info.value.reason


def test_a_binary_file_is_refused_as_not_text(tmp_path: Path):
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 100)
    assert "not a text file" in reason(tmp_path / "blob.bin")


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path):
    big = tmp_path / "huge.txt"
    with open(big, "wb") as fh:  # sparse: 200 MB on paper, nothing on disk
        fh.truncate(200 * 1024 * 1024)
    assert "too big (210 MB" in reason(big)


def test_an_encrypted_pdf_is_refused_as_password_protected(tmp_path: Path):
    path = make_encrypted_pdf(tmp_path / "locked.pdf", "Top secret plans")
    assert "protected by a password" in reason(path)


def test_a_corrupt_pdf_is_refused_as_damaged(tmp_path: Path):
    good = make_pdf(tmp_path / "good.pdf", ["Some text"]).read_bytes()
    (tmp_path / "cut.pdf").write_bytes(good[: len(good) // 3])
    (tmp_path / "fake.pdf").write_bytes(b"this was never a pdf at all\n" * 20)
    assert "damaged or not a PDF" in reason(tmp_path / "cut.pdf")
    assert "damaged or not a PDF" in reason(tmp_path / "fake.pdf")


def test_a_docx_that_is_a_renamed_zip_bomb_is_refused_unopened(tmp_path: Path):
    path = make_zip_bomb(tmp_path / "report.docx")
    assert "ZIP bomb" in reason(path)


def test_a_renamed_zip_and_a_broken_docx_are_refused_as_not_word_documents(tmp_path: Path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "photos.docx", "w") as zf:
        zf.writestr("photo.txt", "not word")
    (tmp_path / "broken.docx").write_bytes(b"PK\x03\x04 garbage")
    assert "not a Word document" in reason(tmp_path / "photos.docx")
    assert "damaged or not a DOCX" in reason(tmp_path / "broken.docx")


def test_a_file_that_vanished_is_refused_as_gone(tmp_path: Path):
    assert "no longer there" in reason(tmp_path / "gone.txt")


def test_a_text_file_in_no_recognisable_encoding_is_refused(tmp_path: Path):
    import random

    rng = random.Random(7)  # bytes that are no encoding's text, without NULs (so not taken for binary)
    (tmp_path / "mystery.txt").write_bytes(bytes(rng.choice(range(0x80, 0x100)) for _ in range(3000)))
    assert "encoding could not be recognised" in reason(tmp_path / "mystery.txt")


def test_a_document_with_too_much_text_is_refused(tmp_path: Path):
    (tmp_path / "long.txt").write_text("word " * 5000, encoding="utf-8")
    assert "too much text" in reason(tmp_path / "long.txt", max_chars=10_000)


def test_a_pdf_that_takes_too_long_is_stopped_with_the_page_it_reached(tmp_path: Path):
    path = make_pdf(tmp_path / "slow.pdf", ["text"] * 5)
    assert "took too long (stopped at page 1 of 5)" in reason(path, max_seconds=-1.0)


# --- chunks, retrieval, fitting ---


def doc_of(text: str, name: str = "a.txt") -> Document:
    return Document(name, "text", len(text), text)


def test_chunks_cover_the_whole_text_in_order_and_overlap_at_their_edges():
    text = "\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(200))
    chunks = chunk_document(doc_of(text), size=600, overlap=100)
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.start < b.start <= a.end  # no gap, some overlap
        assert a.text == text[a.start : a.end]
    assert all(len(c.text) <= 600 for c in chunks)


def test_the_fts_query_quotes_every_word_so_no_query_syntax_gets_through():
    assert fts_query('What does "NEAR(" mean? AND OR *') == '"and" OR "does" OR "mean" OR "near" OR "or" OR "what"'
    assert fts_query("?!") == ""


def test_the_index_ranks_the_passage_that_holds_the_questions_words_first():
    docs = [doc_of("Apples are red. " * 40 + "\n\n" + "The flux capacitor needs 1.21 gigawatts. " * 3
                   + "\n\n" + "Pears are green. " * 40)]
    chunks = chunk_document(docs[0], size=300, overlap=50)
    index = ChunkIndex(chunks)
    best = index.best("How many gigawatts does the flux capacitor need?")
    index.close()
    assert "gigawatts" in chunks[best[0]].text


def test_documents_that_fit_go_in_whole_and_are_seen_entirely():
    docs = [doc_of("alpha beta gamma", "a.txt"), doc_of("delta epsilon", "b.md")]
    ctx = DocumentContext.build(docs, "question", budget_tokens=100, count_tokens=words)
    assert ctx.whole and ctx.coverage == {"a.txt": 1.0, "b.md": 1.0}
    assert "alpha beta gamma" in ctx.text and "delta epsilon" in ctx.text
    assert with_documents("What is it?", ctx).endswith("\n\nWhat is it?")
    assert [c.name for c in ctx.citations] == ["a.txt", "b.md"]


def test_documents_that_do_not_fit_give_the_best_passages_within_the_budget_with_their_place():
    filler = "\n".join(f"Line {i} is about nothing in particular at all." for i in range(400))
    needle = "The reactor's coolant valve is labelled V7 and opens at 80 bar."
    text = filler + "\n" + needle + "\n" + filler
    docs = [doc_of(text, "plant.txt")]
    ctx = DocumentContext.build(docs, "Which valve is the coolant valve?", budget_tokens=400, count_tokens=words)
    assert not ctx.whole
    assert needle in ctx.text
    assert ctx.tokens <= 400
    assert 0 < ctx.coverage["plant.txt"] < 0.25
    cited = [c for c in ctx.citations if needle in c.text]
    assert cited and cited[0].where.startswith("lines ") and cited[0].name == "plant.txt"
    line = text[: text.index(needle)].count("\n") + 1
    first, last = (int(x) for x in cited[0].where.removeprefix("lines ").split("–"))
    assert first <= line <= last
