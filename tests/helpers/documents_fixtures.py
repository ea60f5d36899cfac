"""Documents for the attachment tests, written by the tests themselves: PDFs, DOCX files and bad files."""

from __future__ import annotations

import zipfile
from pathlib import Path


def _escape(line: str) -> str:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(path: Path, pages: list[str]) -> Path:
    """A PDF with one page per string, each line of it set in Helvetica (text a PDF reader can extract)."""
    objects: list[bytes] = []
    n = len(pages)
    font_id = 3 + 2 * n
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    for i, text in enumerate(pages):
        ops = ["BT", "/F1 11 Tf", "14 TL", "72 760 Td"]
        for line in text.split("\n"):
            ops.append(f"({_escape(line)}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1", "replace")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for k, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def make_encrypted_pdf(path: Path, text: str, password: str = "secret") -> Path:
    """A PDF that needs ``password`` to open."""
    from pypdf import PdfReader, PdfWriter

    plain = make_pdf(path.with_suffix(".plain.pdf"), [text])
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password=password, owner_password=password, algorithm="RC4-128")
    with open(path, "wb") as fh:
        writer.write(fh)
    plain.unlink()
    return path


def make_docx(path: Path, paragraphs: list[str], table: list[list[str]] | None = None) -> Path:
    """A Word document with these paragraphs, then a table of these rows."""
    import docx

    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        t = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, cell in enumerate(row):
                t.cell(r, c).text = cell
    document.save(str(path))
    return path


def make_zip_bomb(path: Path, unpacked_mb: int = 64) -> Path:
    """A ZIP renamed .docx whose one member unpacks to ``unpacked_mb`` MB of zeros (packed ~1000× smaller)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("word/document.xml", "w") as member:
            block = b"\0" * (1 << 20)
            for _ in range(unpacked_mb):
                member.write(block)
    return path
