"""The chat view: lookahead tints over rendered Markdown, keyboard-reachable actions, copy feedback, code that fits,
attached files' chips and the sources a reply was given."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette, QTextFormat
from PySide6.QtWidgets import QApplication, QPushButton, QVBoxLayout, QWidget

from app import paths
from app.attachments import Attachment, ReplySources, attachments_to_json
from app.marks import OWN, Run, TokenMarks
from app.store import StoredMessage
from app.widgets.chat_pane import ChatPane
from app.widgets.chat_view import ChatView
from app.widgets.markdown_view import COPIED_MS, COPIED_TEXT, MarkdownView
from app.widgets.marked_text import MarksLegend, contrast_ratio, source_colour
from app.widgets.message_bubble import MessageBubble
from engine.documents import Citation
from tests.helpers.app_fixtures import OFFSCREEN_NOISE
from tests.helpers.optional import present

pytestmark = OFFSCREEN_NOISE

CODE = "def greet(name):\n    return 'Hello, ' + name"
REPLY_PIECES = [  # (text as written, source): the runs of a reply with bold text, a list and a code fence
    ("Some ", OWN),
    ("**bold** words", "prompt"),
    (" here.\n\n- a ", OWN),
    ("listed item", "reply"),
    ("\n\n```python\n", OWN),
    ("def greet", "kept"),
    ("(name):\n    return 'Hello, ' + name", OWN),
    ("\n```\n\nThe ", OWN),
    ("end.", "window"),
]
REPLY = "".join(text for text, _source in REPLY_PIECES)


def reply_marks() -> TokenMarks:
    return TokenMarks([Run(text, source, step, 4) for step, (text, source) in enumerate(REPLY_PIECES)])


def background_at(view: MarkdownView, position: int) -> str:
    """The tint drawn under the character at ``position`` ("" when it has none)."""
    block = view.document().findBlock(position)
    offset = position - block.position()
    for r in block.layout().formats():
        if r.start <= offset < r.start + r.length and r.format.hasProperty(QTextFormat.Property.BackgroundBrush):
            return r.format.background().color().name()
    return ""


def tints(view: MarkdownView, word: str) -> set[str]:
    """The tints under each character of ``word`` where the view shows it."""
    start = view.toPlainText().index(word)
    return {background_at(view, p) for p in range(start, start + len(word))}


def test_with_lookahead_shown_a_reply_stays_markdown_and_each_run_is_tinted_where_it_shows(qtbot):
    bubble = MessageBubble("assistant", REPLY, message_id=2)
    qtbot.addWidget(bubble)
    bubble.resize(600, 400)
    bubble.marks = reply_marks()
    bubble.set_show_lookahead(True)
    with qtbot.waitExposed(bubble):
        bubble.show()
    view = bubble.marked
    assert view is not None and not view.isHidden() and bubble.body.isHidden()
    shown = view.toPlainText()
    assert "**" not in shown and "```" not in shown and "python" not in shown  # rendered, not raw
    assert shown.startswith("Some bold words here.")

    assert tints(view, "bold words") == {present(source_colour("prompt", False)).name()}
    assert tints(view, "listed item") == {present(source_colour("reply", False)).name()}
    assert tints(view, "def greet") == {present(source_colour("kept", False)).name()}
    assert tints(view, "(name):") == {""}  # the model's own text is left untinted
    assert tints(view, "end.") == {present(source_colour("window", False)).name()}
    assert tints(view, "Some") == {""}

    code = [b for b in _blocks(view) if b.blockFormat().hasProperty(QTextFormat.Property.BlockCodeLanguage)]
    assert [b.text() for b in code] == CODE.split("\n")
    colours = {r.format.foreground().color().name() for b in code for r in b.layout().formats()}
    assert len(colours) >= 2, "the code under the tints was not highlighted"

    at = shown.index("listed item") + 3
    assert view.run_at(at) == 3 and "step 4" in view.marks.runs[3].describe()
    rect = view.cursorRect(_cursor_at(view, at + 1))  # the tooltip of a run is its step, source and batch
    tip = view.tooltip_at(rect.center())
    assert "step 4" in tip and "drafted from this reply" in tip and "batch of 4" in tip

    bubble.set_show_lookahead(False)  # back to plain Markdown, same rendering and no tints
    assert not bubble.body.isHidden() and view.isHidden()
    assert bubble.body.toPlainText() == shown and tints(bubble.body, "bold words") == {""}


def test_the_legend_reads_well_on_every_tint_in_light_and_dark_palettes(qtbot):
    light = QPalette(QColor("#efefef"))
    dark = QPalette(QColor("#353535"))
    for palette, colours in ((light, ("#efefef", "#1a1a1a", "#ffffff", "#000000")),
                             (dark, ("#353535", "#f0f0f0", "#232323", "#f0f0f0"))):
        for role, colour in zip((QPalette.ColorRole.Window, QPalette.ColorRole.WindowText, QPalette.ColorRole.Base,
                                 QPalette.ColorRole.Text), colours, strict=True):
            palette.setColor(role, QColor(colour))
    legend = MarksLegend()
    qtbot.addWidget(legend)
    for palette, is_dark in ((light, False), (dark, True)):
        legend.setPalette(palette)
        assert set(legend.colours) == set(legend.sources)
        for source, (text, background) in legend.colours.items():
            assert background == source_colour(source, is_dark)
            assert background.name() in legend.text() and text.name() in legend.text()
            assert contrast_ratio(text, background) >= 4.5, (source, is_dark)
            # the reply's own text colour on the same tint, in the chat
            assert contrast_ratio(palette.color(QPalette.ColorRole.Text), background) >= 4.5, (source, is_dark)
        words = palette.color(QPalette.ColorRole.WindowText)
        assert contrast_ratio(words, palette.color(QPalette.ColorRole.Window)) >= 4.5
        assert "color" not in legend.text().split("<span")[0]  # the words around the chips: the palette's text


def _window_with_chat(qtbot) -> tuple[QWidget, ChatPane]:
    """A chat between other controls, as in the main window: the messages are added after all of them."""
    window = QWidget()
    qtbot.addWidget(window)
    layout = QVBoxLayout(window)
    pane = ChatPane()
    layout.addWidget(pane)
    layout.addWidget(QPushButton("Another panel"))
    window.resize(700, 600)
    pane.chat_view.add_message("user", "Say hello", 1, alternatives=[1, 5])
    pane.chat_view.add_message("assistant", "Hello **there**", 2)
    with qtbot.waitActive(window):
        window.show()
        window.activateWindow()
    return window, pane


def _tab_until(
    qtbot, start: QWidget, target: QWidget, backwards: bool = False, limit: int = 40,
) -> list[QWidget | None]:
    """Press Tab (or Shift+Tab) from ``start`` until ``target`` has the focus; the widgets passed on the way."""
    start.setFocus(Qt.FocusReason.TabFocusReason)
    passed = [QApplication.focusWidget()]
    modifier = Qt.KeyboardModifier.ShiftModifier if backwards else Qt.KeyboardModifier.NoModifier
    while passed[-1] is not target and len(passed) < limit:
        assert passed[-1] is not None, "nothing has the focus"
        qtbot.keyClick(passed[-1], Qt.Key.Key_Backtab if backwards else Qt.Key.Key_Tab, modifier)
        passed.append(QApplication.focusWidget())
    return passed


def test_tab_goes_from_the_chat_through_each_messages_actions_in_the_order_shown(qtbot):
    _window, pane = _window_with_chat(qtbot)
    user, reply = pane.chat_view.bubbles()
    passed = _tab_until(qtbot, pane.chat_view, reply.copy_button)
    assert passed[-1] is reply.copy_button
    actions = [w for w in passed if w in (user.next_button, user.edit_button, user.fork_button, user.copy_button,
                                          reply.regenerate_button, reply.fork_button, reply.copy_button)]
    assert actions == [user.next_button, user.edit_button, user.fork_button, user.copy_button,
                       reply.regenerate_button, reply.fork_button, reply.copy_button]
    # nothing else of the window comes between
    assert all(w is not None and pane.chat_view.isAncestorOf(w) for w in passed[1:])

    back = _tab_until(qtbot, pane.input, reply.copy_button, backwards=True)  # Shift+Tab from the input box
    assert back[-1] is reply.copy_button and len(back) <= 4


def test_enter_or_space_on_a_focused_copy_copies_and_it_says_copied_for_a_moment(qtbot):
    _window, pane = _window_with_chat(qtbot)
    reply = pane.chat_view.bubbles()[-1]
    QGuiApplication.clipboard().setText("")
    passed = _tab_until(qtbot, pane.chat_view, reply.copy_button)
    assert passed[-1] is reply.copy_button
    with qtbot.waitSignal(reply.copy_button.copied, timeout=1000):
        qtbot.keyClick(reply.copy_button, Qt.Key.Key_Return)
    assert QGuiApplication.clipboard().text() == "Hello **there**"
    assert reply.copy_button.text() == COPIED_TEXT
    qtbot.waitUntil(lambda: reply.copy_button.text() == "Copy", timeout=COPIED_MS + 2000)

    user = pane.chat_view.bubbles()[0]
    user.copy_button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.keyClick(user.copy_button, Qt.Key.Key_Space)
    assert QGuiApplication.clipboard().text() == "Say hello"
    with qtbot.waitSignal(pane.alternativeRequested, timeout=1000) as blocker:  # ‹ › answer the keyboard too
        qtbot.keyClick(user.next_button, Qt.Key.Key_Enter)
    assert blocker.args == [5]


def test_a_focused_action_shows_a_ring_in_the_highlight_colour(qtbot):
    _window, pane = _window_with_chat(qtbot)
    pane.window().setStyleSheet((paths.resources_dir() / "styles" / "app.qss").read_text(encoding="utf-8"))
    button = pane.chat_view.bubbles()[-1].fork_button
    highlight = button.palette().color(QPalette.ColorRole.Highlight).name()

    def edge_colours() -> set[str]:
        image = button.grab().toImage()
        y = image.height() // 2
        return {image.pixelColor(x, y).name() for x in (0, 1, image.width() - 1, image.width() - 2)}

    pane.input.setFocus()
    qtbot.waitUntil(lambda: not button.hasFocus())
    assert highlight not in edge_colours()
    button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(button.hasFocus)
    assert highlight in edge_colours()


def test_each_code_block_has_a_copy_button_that_copies_just_its_code(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 500)
    other = "echo hi"
    bubble = view.add_message("assistant", f"Try:\n\n```python\n{CODE}\n```\n\nthen\n\n```sh\n{other}\n```\n", 2)
    view.show()
    body = bubble.body
    assert body.code_blocks() == [CODE, other]
    assert [b.isVisibleTo(body) for b in body.code_buttons] == [True, True]
    first, second = body.code_buttons
    assert first.geometry().bottom() < second.geometry().top()  # each above its own block
    second.click()
    assert QGuiApplication.clipboard().text() == other
    with qtbot.waitSignal(first.copied, timeout=1000):
        qtbot.keyClick(first, Qt.Key.Key_Return)
    assert QGuiApplication.clipboard().text() == CODE
    assert first.text() == COPIED_TEXT
    qtbot.waitUntil(lambda: first.text() == "Copy code", timeout=COPIED_MS + 2000)

    bubble.set_text("No code any more")
    assert not any(b.isVisibleTo(body) for b in body.code_buttons)


@pytest.mark.parametrize("marked", [False, True])
def test_a_code_line_wider_than_a_narrow_view_wraps_and_is_shown_whole(qtbot, marked):
    long_line = "result = compute(" + ", ".join(f"argument_{k}" for k in range(30)) + ")"
    text = f"Code:\n\n```python\n{long_line}\n```\n"
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(360, 500)
    view.show()
    bubble = view.add_message("assistant", text, 2, marks=TokenMarks([Run(text, "prompt", 0, 4)]))
    view.set_show_lookahead(marked)
    shown = bubble.marked if marked else bubble.body
    assert shown is not None
    qtbot.waitUntil(lambda: shown.isVisible() and shown.width() < 360)
    block = next(b for b in _blocks(shown) if b.text() == long_line)
    lines = [block.layout().lineAt(k) for k in range(block.layout().lineCount())]
    width = shown.viewport().width()
    assert len(lines) > 1  # wrapped
    assert all(line.naturalTextRect().right() <= width for line in lines)
    assert sum(line.textLength() for line in lines) == len(long_line)  # every character on some line
    assert shown.document().size().width() <= width + 1
    assert shown.height() >= shown.document().size().height()  # and the view is tall enough for all the lines


def _blocks(view: MarkdownView):
    block = view.document().begin()
    while block.isValid():
        yield block
        block = block.next()


def _cursor_at(view: MarkdownView, position: int):
    cursor = view.textCursor()
    cursor.setPosition(position)
    return cursor


MANUAL = Attachment("manual.pdf", "pdf", 1_200_000, "Warranty...", (0, 40, 90), path="/docs/manual.pdf", tokens=3400)
BIG = Attachment("big.txt", "text", 90_000, "lots of text", path="/docs/big.txt")
PASSAGE = "<script>alert('x')</script> **not bold** <b>raw</b> & done"


def test_a_user_message_shows_a_chip_per_file_and_how_much_of_it_the_model_saw(qtbot):
    bubble = MessageBubble("user", "What is covered?", 1)
    qtbot.addWidget(bubble)
    bubble.set_attachments([MANUAL, BIG], {"manual.pdf": 1.0, "big.txt": 0.2349})
    chips = bubble.attachment_chips
    assert chips is not None and not chips.isHidden()
    assert chips.texts() == [MANUAL.chip_text(), BIG.chip_text() + " · seen 23%"]
    assert chips.texts()[0] == "manual.pdf · 1.2 MB · 3 pages · 3,400 tokens"
    assert "/docs/manual.pdf" in chips.chips[0].toolTip() and "all of it" in chips.chips[0].toolTip()
    assert "23%" in chips.chips[1].toolTip()
    assert all(c.textFormat() == Qt.TextFormat.PlainText for c in chips.chips)
    bubble.set_attachments([BIG], {"big.txt": 0.004})  # set again: replaced, a sliver is not "0%"
    assert chips.texts() == [BIG.chip_text() + " · seen <1%"]
    bubble.set_attachments([MANUAL])  # not placed yet: no share said
    assert chips.texts() == [MANUAL.chip_text()]
    bubble.set_attachments([])
    assert chips.isHidden()


def test_sources_under_a_reply_open_to_each_passage_shown_as_plain_text_never_markup(qtbot):
    bubble = MessageBubble("assistant", "It covers parts.", 2)
    qtbot.addWidget(bubble)
    long_text = "x" * 10_000
    sources = ReplySources((Citation("manual.pdf", "page 3", PASSAGE), Citation("big.txt", "lines 10–42", long_text)),
                           {"manual.pdf": 1.0, "big.txt": 0.1}, whole=False)
    bubble.set_sources(sources)
    bubble.show()
    section = bubble.sources_section
    assert section is not None and section.toggle.text() == "Sources (2)"
    assert not section.body.isVisible()
    section.toggle.click()
    assert section.body.isVisible() and "did not fit whole" in section.note.text()
    assert [b.text() for b in section.citation_buttons] == ["manual.pdf · page 3", "big.txt · lines 10–42"]
    first, second = section.passages
    assert not first.isVisible()
    section.citation_buttons[0].click()
    assert first.isVisible() and first.textFormat() == Qt.TextFormat.PlainText
    assert first.text() == PASSAGE  # the tags and the Markdown are shown as written
    assert second.text().startswith("x" * 100) and "6,000 more characters" in second.text()
    section.toggle.click()
    assert not section.body.isVisible()
    bubble.set_sources(None)
    assert section.isHidden()


def test_tab_reaches_a_replys_sources_after_its_text_and_before_the_next_message(qtbot):
    _window, pane = _window_with_chat(qtbot)
    _user, reply = pane.chat_view.bubbles()
    reply.set_sources(ReplySources((Citation("manual.pdf", "page 3", "text"),), {"manual.pdf": 1.0}))
    section = reply.sources_section
    assert section is not None
    section.toggle.click()
    passed = _tab_until(qtbot, reply.copy_button, section.citation_buttons[0])
    assert passed[-2:] == [section.toggle, section.citation_buttons[0]]
    assert all(w is not None and reply.isAncestorOf(w) for w in passed)
    assert _tab_until(qtbot, section.citation_buttons[0], pane.input)[-1] is pane.input


def test_a_stored_chat_shows_each_messages_files_and_its_replys_sources(qtbot):
    pane = ChatPane()
    qtbot.addWidget(pane)
    sources = ReplySources((Citation("big.txt", "lines 1–9", "passage"),), {"manual.pdf": 1.0, "big.txt": 0.5}, False)
    pane.show_messages([
        StoredMessage(1, 1, "user", "First", 1.0, attachments_json=attachments_to_json([MANUAL, BIG]),
                documents_json=sources.to_json()),
        StoredMessage(2, 1, "assistant", "Answer", 2.0, parent_id=1),
        StoredMessage(3, 1, "user", "Plain follow-up", 3.0, parent_id=2),
        StoredMessage(4, 1, "assistant", "Second answer", 4.0, parent_id=3),
    ])
    first, answer, plain, second = pane.chat_view.bubbles()
    assert first.attachment_chips is not None
    assert first.attachment_chips.texts() == [MANUAL.chip_text(), BIG.chip_text() + " · seen 50%"]
    assert answer.sources_section is not None and answer.sources_section.toggle.text() == "Sources (1)"
    assert plain.attachment_chips is None and second.sources_section is None
