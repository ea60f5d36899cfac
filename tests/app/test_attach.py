"""Attaching files in the chat: the paperclip and drops, reading off the GUI thread, chips, limits and bad files."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QElapsedTimer, QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QVBoxLayout, QWidget

from app import attach_reader
from app.attachments import Attachment
from app.widgets.attachments_bar import MAX_FILES
from app.widgets.chat_pane import ChatPane
from app.widgets.file_intake import ATTACH_SHORTCUT
from engine.documents import SUPPORTED_SUFFIXES, read_document
from tests.helpers.app_fixtures import OFFSCREEN_NOISE
from tests.helpers.documents_fixtures import make_encrypted_pdf, make_pdf, make_zip_bomb
from tests.helpers.event_loop import EventLoopWatch

pytestmark = OFFSCREEN_NOISE

READ_TIMEOUT_MS = 60_000
TYPED = "What does the manual say about the warranty?"


@pytest.fixture
def pane(qtbot) -> Iterator[ChatPane]:
    """A chat pane in a window of its own, shown, with a message typed."""
    window = QWidget()
    qtbot.addWidget(window)
    pane = ChatPane()
    QVBoxLayout(window).addWidget(pane)
    window.resize(700, 600)
    pane.input.setPlainText(TYPED)
    with qtbot.waitExposed(window):
        window.show()
    yield pane
    pane.stop_reading()


def attach_and_wait(qtbot, pane: ChatPane, *paths: Path) -> None:
    pane.attach_files([str(p) for p in paths])
    qtbot.waitUntil(lambda: not pane.is_reading_attachments(), timeout=READ_TIMEOUT_MS)


NOTES = "# Warranty\n\nTwo years, parts and labour.\n"


def write_notes(folder: Path, name: str = "notes.md", text: str = NOTES) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def drag_files(widget: QWidget, paths: list[Path], drop: bool = True) -> QDropEvent:
    """Drag these files over ``widget`` (and drop them): the events a file manager's drag brings."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    mime.setText("\n".join(str(p) for p in paths))  # file managers also offer the paths as text
    actions = Qt.DropAction.CopyAction | Qt.DropAction.MoveAction | Qt.DropAction.LinkAction
    enter = QDragEnterEvent(QPoint(10, 10), actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted(), "the drag of files was refused"
    event = QDropEvent(QPointF(10, 10), actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    if drop:
        QApplication.sendEvent(widget, event)
    return event


def test_the_paperclip_offers_the_readable_kinds_and_each_file_read_becomes_a_chip_with_its_path(
    qtbot, pane, tmp_path, monkeypatch
):
    notes = write_notes(tmp_path)
    manual = make_pdf(tmp_path / "manual.pdf", ["Warranty: two years.", "Returns: thirty days."])
    asked: list[str] = []

    def pick(_parent, _title, _folder, filters):
        asked.append(filters)
        return [str(notes), str(manual)], ""

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(pick))
    with qtbot.waitSignal(pane.attachmentsChanged, timeout=5000):
        pane.files.button.click()
    assert pane.is_reading_attachments() or pane.pending_attachments()  # reading has started, off the GUI thread
    qtbot.waitUntil(lambda: len(pane.pending_attachments()) == 2, timeout=READ_TIMEOUT_MS)

    documents, everything = asked[0].split(";;")
    assert all(f"*{suffix}" in documents for suffix in (".pdf", ".docx", ".py", ".md", ".csv"))
    assert len(documents.split()) - 3 == len(SUPPORTED_SUFFIXES) and everything == "All files (*)"
    first, second = pane.pending_attachments()
    assert (first.name, first.path, first.text) == ("notes.md", str(notes), notes.read_text())
    assert second.kind == "pdf" and second.pages == 2 and "Returns: thirty days." in second.text
    chips = pane.attachments_bar.chips()
    assert [c.label.text() for c in chips] == [first.chip_text(), second.chip_text()]
    assert chips[1].toolTip() == str(manual) and "2 pages" in chips[1].label.text()
    assert all(c.progress.isHidden() for c in chips)
    assert pane.input.toPlainText() == TYPED


def test_the_paperclip_is_reached_by_tab_and_ctrl_shift_a_opens_the_dialog(qtbot, pane, monkeypatch):
    calls: list[int] = []

    def get_open_file_names(*_args: object) -> tuple[list[str], str]:
        calls.append(1)
        return [], ""

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(get_open_file_names))
    assert pane.files.action.shortcut() == QKeySequence(ATTACH_SHORTCUT) == QKeySequence("Ctrl+Shift+A")
    assert pane.files.button.focusPolicy() & Qt.FocusPolicy.TabFocus
    assert "Ctrl+Shift+A" in pane.files.button.toolTip() and pane.files.button.accessibleName()
    assert not pane.files.button.icon().isNull()
    window = pane.window()
    window.activateWindow()
    qtbot.waitActive(window)
    pane.input.setFocus()
    qtbot.keyClick(pane.input, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert calls == [1]
    pane.files.button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.keyClick(pane.files.button, Qt.Key.Key_Space)
    assert calls == [1, 1]
    assert pane.input.toPlainText() == TYPED and not pane.pending_attachments()


def test_files_dropped_on_the_chat_or_on_the_input_box_are_attached_and_the_typed_text_stays(qtbot, pane, tmp_path):
    a, b = write_notes(tmp_path, "a.txt", "first file"), write_notes(tmp_path, "b.txt", "second file")
    pane.chat_view.add_message("assistant", "Some **earlier** reply", 2)
    # A drop on a message reaches the pane: no widget of the conversation takes drops itself.
    bubble = pane.chat_view.bubbles()[0]
    target = bubble.body.viewport()
    while not target.acceptDrops():
        target = target.parentWidget()
    assert target is pane

    drag_files(pane, [a])
    drag_files(pane.input.viewport(), [b])
    qtbot.waitUntil(lambda: len(pane.pending_attachments()) == 2, timeout=READ_TIMEOUT_MS)
    assert [x.text for x in pane.pending_attachments()] == ["first file", "second file"]
    assert pane.input.toPlainText() == TYPED  # the paths were not typed into the message

    mime = QMimeData()
    mime.setText("just some words")  # a drag of text is the input box's, as before
    enter = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    enter.ignore()
    QApplication.sendEvent(pane, enter)
    assert not enter.isAccepted() and len(pane.pending_attachments()) == 2


def test_the_same_file_twice_is_attached_once_with_a_note(qtbot, pane, tmp_path):
    notes = write_notes(tmp_path)
    attach_and_wait(qtbot, pane, notes)
    attach_and_wait(qtbot, pane, tmp_path / "." / "notes.md")  # the same file by another spelling
    assert len(pane.pending_attachments()) == 1
    assert pane.attachments_bar.notices() == ["notes.md is attached already."]


def test_no_more_than_the_limit_of_files_go_on_one_message_and_the_rest_are_named(qtbot, pane, tmp_path):
    paths = [write_notes(tmp_path, f"part{i}.txt", f"part {i}") for i in range(MAX_FILES + 2)]
    attach_and_wait(qtbot, pane, *paths)
    assert [a.name for a in pane.pending_attachments()] == [p.name for p in paths[:MAX_FILES]]
    notes = pane.attachments_bar.notices()
    assert len(notes) == 2 and f"part{MAX_FILES}.txt" in notes[0] and f"at most {MAX_FILES} files" in notes[0]


def _binary(folder: Path) -> Path:
    path = folder / "photo.txt"
    path.write_bytes(bytes(range(256)) * 100)
    return path


def _huge(folder: Path) -> Path:
    path = folder / "dump.log"
    with open(path, "wb") as fh:  # sparse: 200 MB on paper, nothing on disk
        fh.truncate(200 * 1024 * 1024)
    return path


def _corrupt_pdf(folder: Path) -> Path:
    good = make_pdf(folder / "good.pdf", ["Some text"]).read_bytes()
    (folder / "good.pdf").unlink()
    path = folder / "scan.pdf"
    path.write_bytes(good[: len(good) // 3])
    return path


def _mystery(folder: Path) -> Path:
    rng = random.Random(7)  # bytes that are no encoding's text, without NULs (so not taken for binary)
    path = folder / "mystery.txt"
    path.write_bytes(bytes(rng.choice(range(0x80, 0x100)) for _ in range(3000)))
    return path


def _gone(folder: Path) -> Path:
    path = write_notes(folder, "draft.txt")
    path.unlink()  # dropped, then deleted before it was read
    return path


BAD_FILES = {
    "binary": (_binary, "photo.txt: this is not a text file"),
    "200 MB": (_huge, "dump.log: the file is too big (210 MB"),
    "encrypted pdf": (lambda f: make_encrypted_pdf(f / "locked.pdf", "Plans"), "locked.pdf: this PDF is protected"),
    "corrupt pdf": (_corrupt_pdf, "scan.pdf: this PDF is damaged or not a PDF"),
    "zip bomb docx": (lambda f: make_zip_bomb(f / "report.docx"), "report.docx: this file unpacks to"),
    "unknown encoding": (_mystery, "mystery.txt: its text encoding could not be recognised"),
    "vanished before it was read": (_gone, "draft.txt: the file is no longer there"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_file_that_cannot_be_used_is_named_with_the_reason_and_nothing_typed_or_attached_is_lost(
    qtbot, pane, tmp_path, dialogs, case
):
    good = write_notes(tmp_path)
    attach_and_wait(qtbot, pane, good)
    make, said = BAD_FILES[case]
    bad = make(tmp_path)
    drag_files(pane.input.viewport(), [bad])
    qtbot.waitUntil(lambda: not pane.is_reading_attachments(), timeout=READ_TIMEOUT_MS)

    (line,) = pane.attachments_bar.notices()
    assert line == f"Could not attach {line.split('Could not attach ', 1)[1]}" and said in line
    assert pane.attachments_bar.notice.isVisibleTo(pane) and not dialogs.shown  # inline: nothing blocks
    assert [a.name for a in pane.pending_attachments()] == ["notes.md"]  # the bad one left no chip
    assert len(pane.attachments_bar.chips()) == 1
    assert pane.input.toPlainText() == TYPED

    pane.attachments_bar.dismiss_button.click()  # the note goes; the pane still attaches files
    assert not pane.attachments_bar.notice.isVisibleTo(pane)
    attach_and_wait(qtbot, pane, write_notes(tmp_path, "more.txt", "more"))
    assert [a.name for a in pane.pending_attachments()] == ["notes.md", "more.txt"]


def test_a_file_deleted_after_it_was_attached_still_goes_with_its_text_and_nothing_alarming_is_said(
    qtbot, pane, tmp_path
):
    notes = write_notes(tmp_path)
    attach_and_wait(qtbot, pane, notes)
    notes.unlink()
    (kept,) = pane.pending_attachments()
    assert kept.text.startswith("# Warranty") and kept.path == str(notes)
    pane.show_pending([], TYPED, pane.pending_attachments())  # what the runner shows as the message goes
    (bubble,) = [b for b in pane.chat_view.bubbles() if b.role == "user"]
    assert bubble.attachment_chips is not None and bubble.attachment_chips.texts() == [kept.chip_text()]
    pane.clear_attachments()
    assert not pane.attachments_bar.notices() and not pane.pending_attachments()


def test_edit_puts_a_messages_files_back_and_clear_takes_them_off(qtbot, pane):
    files = (Attachment("a.txt", "text", 5, "alpha"), Attachment("b.pdf", "pdf", 9000, "beta", (0,), path="/x/b.pdf"))
    with qtbot.waitSignal(pane.attachmentsChanged, timeout=1000):
        pane.set_attachments(files)
    assert pane.pending_attachments() == files and not pane.is_reading_attachments()
    assert [c.label.text() for c in pane.attachments_bar.chips()] == [f.chip_text() for f in files]
    chip = pane.attachments_bar.chips()[0]
    with qtbot.waitSignal(pane.attachmentsChanged, timeout=1000):
        chip.close_button.click()  # × removes it
    assert pane.pending_attachments() == files[1:]
    with qtbot.waitSignal(pane.attachmentsChanged, timeout=1000):
        pane.clear_attachments()
    assert pane.pending_attachments() == () and not pane.attachments_bar.chip_area.isVisibleTo(pane)


def _record_reading_threads(monkeypatch) -> list[threading.Thread]:
    """Every thread ``read_document`` runs on from now on, as the attachment reader calls it."""
    threads: list[threading.Thread] = []
    real = attach_reader.read_document

    def recording(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(attach_reader, "read_document", recording)
    return threads


def long_book(folder: Path) -> Path:
    """A PDF long enough that its read is still going when the test acts (some seconds, even on a fast machine)."""
    page = "\n".join(f"Line {k}: the warranty covers parts and labour for two years." for k in range(30))
    return make_pdf(folder / "long.pdf", [f"Page {i + 1}\n{page}" for i in range(1500)])


@pytest.mark.timing
def test_a_300_page_pdf_is_read_without_stalling_the_window_shows_progress_and_cancel_stops_it(
    qtbot, pane, tmp_path, monkeypatch
):
    page = "\n".join(f"Line {k}: the warranty covers parts and labour for two years." for k in range(30))
    book = make_pdf(tmp_path / "book.pdf", [f"Page {i + 1}\n{page}" for i in range(300)])
    readers = _record_reading_threads(monkeypatch)
    progress: list[int] = []
    watch = EventLoopWatch()
    watch.start()
    pane.attach_files([str(book)])
    (chip,) = pane.attachments_bar.chips()
    chip.progress.valueChanged.connect(progress.append)
    assert pane.is_reading_attachments() and chip.progress.isVisibleTo(pane)
    qtbot.waitUntil(lambda: not pane.is_reading_attachments(), timeout=READ_TIMEOUT_MS)
    # A quick read may end within a few ticks: the watch goes on until it has enough of them to judge by (a read
    # that held the event loop shows as a long gap among them all the same).
    qtbot.waitUntil(lambda: len(watch.wall_ms) > 10, timeout=READ_TIMEOUT_MS)
    watch.stop()
    assert readers and threading.main_thread() not in readers  # read on a pool thread, never the GUI's
    watch.assert_kept_running()  # real time: the read (about half a second here) never holds the event loop
    assert any(0 < p < 100 for p in progress) and progress == sorted(progress)
    (read,) = pane.pending_attachments()
    assert read.pages == 300 and "Page 300" in read.text

    pane.clear_attachments()
    pane.attach_files([str(long_book(tmp_path))])
    (chip,) = pane.attachments_bar.chips()
    qtbot.waitUntil(lambda: chip.progress.value() > 0, timeout=READ_TIMEOUT_MS)
    assert chip.is_reading()
    with qtbot.waitSignal(pane.attachments_bar.reader.finished, timeout=5000) as ended:
        chip.close_button.click()  # × while it is read: stop
    assert ended.args[0].cancelled and ended.args[0].attachment is None
    assert not pane.is_reading_attachments() and not pane.pending_attachments()
    assert not pane.attachments_bar.notices()  # the user stopped it: nothing to report


@pytest.mark.timing
def test_closing_stops_the_reads_at_once(qtbot, pane, tmp_path, monkeypatch):
    fractions: list[float] = []  # how far the read got, as it told it (on its pool thread)
    real = attach_reader.read_document

    def telling(path, cancel=None, progress=None, **kwargs):
        def told(fraction: float) -> None:
            fractions.append(fraction)
            if progress is not None:
                progress(fraction)

        return real(path, cancel=cancel, progress=told, **kwargs)

    monkeypatch.setattr(attach_reader, "read_document", telling)
    pane.attach_files([str(long_book(tmp_path))])
    (chip,) = pane.attachments_bar.chips()
    qtbot.waitUntil(lambda: chip.progress.value() > 0, timeout=READ_TIMEOUT_MS)
    clock = QElapsedTimer()
    clock.start()
    assert pane.stop_reading()
    stopping_ms = clock.elapsed()
    assert fractions and max(fractions) < 1.0  # stopped in the middle of the book, not waited out to its end
    # Real time: stopping waits for the page being read (a few ms); 2 s is ample on a loaded CI machine.
    assert stopping_ms < 2000
    assert pane.attachments_bar.reader.running()  # stopped, its cancelled result not yet handed over
    qtbot.waitUntil(lambda: not pane.is_reading_attachments(), timeout=5000)
    assert not pane.pending_attachments()


def test_the_attached_text_is_what_the_engine_reads_from_the_file(qtbot, pane, tmp_path):
    manual = make_pdf(tmp_path / "manual.pdf", ["One", "Two", "Three"])
    attach_and_wait(qtbot, pane, manual)
    (attached,) = pane.pending_attachments()
    assert attached.document() == read_document(manual)


def test_the_context_meter_says_how_much_of_each_attached_file_the_model_sees_in_its_tooltips(qtbot):
    from app.widgets.context_meter import ContextMeter

    meter = ContextMeter()
    qtbot.addWidget(meter)
    meter.set_context(4096)
    meter.set_usage(1234)
    meter.set_documents({"manual.pdf": 1.0, "big.txt": 0.129})
    assert meter.label.text() == "1,234 / 4,096 tokens"  # the line stays short
    assert meter.label.toolTip() == "1,234 / 4,096 tokens · files: manual.pdf 100%, big.txt 12%"
    assert "manual.pdf 100%, big.txt 12%" in meter.toolTip()
    meter.set_usage(2000)  # the files' line stays with a new count
    assert meter.label.toolTip().endswith("· files: manual.pdf 100%, big.txt 12%")
    meter.set_documents({})
    assert meter.label.toolTip() == "" and "files" not in meter.toolTip()


def test_in_the_window_a_file_deleted_before_send_goes_with_its_kept_text_and_its_reply_shows_sources(
    qtbot, make_window, worker_options, dialogs, tmp_path
):
    from app.widgets.shortcuts import shortcut_rows
    from tests.helpers.app_fixtures import REPLY_TIMEOUT_MS, quick_settings, use_fake_engine
    from tests.helpers.make_screenshots import DocsSession

    use_fake_engine(worker_options, DocsSession)
    window = make_window(quick_settings(max_tokens=400))
    assert any(row.what == "Attach files" and row.keys == "Ctrl+Shift+A"
               for row in shortcut_rows(window.help.shortcut_actions()))
    pane = window.chat_pane
    notes = write_notes(tmp_path)
    attach_and_wait(qtbot, pane, notes)
    notes.unlink()  # gone before the message is sent: its text was read when it was attached
    window.input.setPlainText(TYPED)
    with qtbot.waitSignal(window.replyCompleted, timeout=REPLY_TIMEOUT_MS):
        window.send_button.click()
    user, reply = pane.chat_view.bubbles()
    assert user.attachment_chips is not None and user.attachment_chips.texts()[0].startswith("notes.md · ")
    assert reply.sources_section is not None and "Two years" in reply.sources_section.passages[0].text()
    assert NOTES in window.engine.worker._engine.document_texts  # drafted from the kept text
    assert not pane.pending_attachments() and not pane.attachments_bar.notices() and not dialogs.shown
