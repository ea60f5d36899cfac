"""Show lookahead: how each run of a reply came, kept with the message and drawn in the chat and Compare."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QGuiApplication, QTextFormat

from app.marks import OWN, TokenMarks
from app.settings import AppSettings
from engine import StepEvent
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, REPLY_TIMEOUT_MS, quick_settings
from tests.helpers.optional import present

pytestmark = [OFFSCREEN_NOISE]


def event(step: int, texts: tuple[str, ...], sources: tuple[str, ...], batch: int = 4, mode: str = "auto") -> StepEvent:
    return StepEvent(
        step=step, mode=mode, token_ids=tuple(range(len(texts))), text="".join(texts), n_committed=len(texts),
        batch_size=batch, n_logits=batch, n_drafted=0, n_accepted=0,
        n_reevaluated=0, window=0, ngram=0, guesses=0, elapsed_s=0.01, decode_s=0.01,
        token_sources=sources, token_texts=texts,
    )


def test_runs_group_a_steps_tokens_by_source_and_join_to_the_text():
    marks = TokenMarks()
    marks.observe(event(0, ("Hel", "lo"), (OWN, OWN), batch=1))  # cannot happen in one plain step; still one run
    marks.observe(event(1, (",", " wor", "ld", "!"), ("prompt", "prompt", "prompt", OWN)))
    marks.observe(event(2, ("", "é"), ("reply", OWN)))  # a token that added no text leaves no run
    assert [(r.text, r.source, r.step, r.batch) for r in marks.runs] == [
        ("Hello", OWN, 0, 1), (", world", "prompt", 1, 4), ("!", OWN, 1, 4), ("é", OWN, 2, 4),
    ]
    assert marks.text() == "Hello, world!é"
    assert marks.by_source() == {OWN: 7, "prompt": 7}
    assert "step 2" in marks.runs[1].describe() and "prompt" in marks.runs[1].describe()


def test_the_tail_of_a_stopped_reply_joins_the_marks():
    marks = TokenMarks()
    marks.observe(event(0, ("ab",), (OWN,), batch=1))
    closing = StepEvent(step=1, mode="none", token_ids=(), text="c", n_committed=0, batch_size=0, n_logits=0,
                        n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0, guesses=0, elapsed_s=0.0,
                        decode_s=0.0, stop_reason="cancelled")
    marks.observe(closing)
    assert marks.text() == "abc" and len(marks.runs) == 1


def test_stored_marks_come_back_only_for_the_text_they_describe():
    marks = TokenMarks()
    marks.observe(event(0, ("Hi", " there"), ("prompt", OWN)))
    stored = marks.to_json()
    assert "Hi" not in stored  # the message keeps the text; the marks keep lengths
    back = TokenMarks.from_json("Hi there", stored)
    assert back is not None and back.runs == marks.runs
    assert TokenMarks.from_json("Hi there!", stored) is None  # text changed: the marks do not fit
    assert TokenMarks.from_json("Hi there", None) is None
    assert TokenMarks.from_json("Hi there", "not json") is None
    assert TokenMarks.from_json("Hi there", '[[2, "prompt"]]') is None


def test_markdown_syntax_is_skipped_when_runs_are_found_in_the_rendered_text():
    from app.marks import rendered_positions

    def shown(source: str, rendered: str) -> str:
        return "".join(source[i] if i >= 0 else "?" for i in rendered_positions(source, rendered))

    assert shown("**bold** and `code`", "bold and code") == "bold and code"
    source = "Intro\n\n```python\nprint(1)\n```\n\n- one\n- [two](http://two.example/two)"
    positions = rendered_positions(source, "Intro\nprint(1)\none\ntwo")
    assert positions[6] == source.index("print(1)")  # not the "p" of the fence's "python"
    assert positions[-3:] == [source.index("[two]") + k for k in (1, 2, 3)]  # not the link's address
    assert shown("a &amp; b", "a & b") == "a & b"
    assert rendered_positions("abc", "xyz") == [-1, -1, -1]  # nothing in common: nothing is claimed


def test_the_marked_view_redraws_runs_as_they_grow_with_a_tooltip_per_run(qtbot):
    from app.widgets.marked_text import MarkedView, source_colour

    view = MarkedView()
    qtbot.addWidget(view)
    view.resize(400, 200)
    marks = TokenMarks()
    marks.observe(event(0, ("Hello",), (OWN,), batch=1))
    view.show_marks(marks)
    marks.observe(event(1, (" **big**", " world"), ("prompt", OWN)))
    view.show_marks(marks)
    marks.observe(event(1, ("!",), (OWN,)))  # the last run grows
    view.show_marks(marks)
    assert view.toPlainText() == "Hello big world!"
    block = view.document().firstBlock()
    tinted = [(block.text()[r.start : r.start + r.length], r.format.background().color().name())
              for r in block.layout().formats() if r.format.hasProperty(QTextFormat.Property.BackgroundBrush)]
    # bold, yet tinted: its stars not shown
    assert tinted == [(" big", present(source_colour("prompt", False)).name())]
    big = view.toPlainText().index("big")
    assert view.run_at(big) == 1 and view.run_at(0) == 0
    tip = view.marks.runs[present(view.run_at(big))].describe()
    assert "prompt" in tip and "batch of 4" in tip


def test_text_drafted_from_attached_files_has_its_own_tint_legend_chip_and_tooltip(qtbot):
    from app.widgets.marked_text import MarkedView, MarksLegend, source_colour

    view = MarkedView()
    qtbot.addWidget(view)
    marks = TokenMarks()
    marks.observe(event(0, ("The warranty", " covers parts", " and labour."), (OWN, "document", "prompt")))
    view.show_marks(marks)
    block = view.document().firstBlock()
    tinted = [(block.text()[r.start : r.start + r.length], r.format.background().color().name())
              for r in block.layout().formats() if r.format.hasProperty(QTextFormat.Property.BackgroundBrush)]
    assert tinted == [(" covers parts", present(source_colour("document", False)).name()),
                      (" and labour.", present(source_colour("prompt", False)).name())]
    others = {present(source_colour(s, dark)).name()
              for s in ("prompt", "reply", "history", "other_chats", "kept", "window") for dark in (False, True)}
    assert not {present(source_colour("document", dark)).name() for dark in (False, True)} & others
    assert marks.runs[1].describe() == "step 1 · drafted from attached files · batch of 4"

    legend = MarksLegend()
    qtbot.addWidget(legend)
    assert "document" in legend.sources and "attached&nbsp;files" in legend.text()
    assert present(source_colour("document", False)).name() in legend.text()
    assert "attached files: drafted from attached files" in legend.toolTip()


def test_a_reply_that_repeats_the_prompt_is_marked_kept_and_copied_plain(qtbot, make_window, monkeypatch):
    """With the bundled model: drafts from the prompt land, are marked, survive a restart, and Copy is plain text."""
    monkeypatch.setenv("LOOKAHEAD_COST_CURVE", "flat")  # Auto drafts whenever it has a draft, on any CPU
    settings = quick_settings(max_tokens=48, auto=True, show_lookahead=True)
    first = make_window(settings)
    first.input.setPlainText(
        "Turn this paragraph into a bulleted list:\n\nTo make tea, boil water, put a tea bag in a cup, pour the hot "
        "water over the tea bag, wait three minutes, remove the tea bag, and add milk or sugar if you like."
    )
    with qtbot.waitSignal(first.replyCompleted, timeout=REPLY_TIMEOUT_MS) as blocker:
        first.send_button.click()
    record = blocker.args[0]
    bubble = first.chat_view.bubbles()[-1]
    assert bubble.marks is not None
    runs = bubble.marks.runs
    assert "".join(r.text for r in runs) == record.text  # no token lost or doubled
    assert sum(len(r.text) for r in runs if r.source == "prompt") >= 10, [(r.text, r.source) for r in runs]
    assert bubble.marked is not None and not bubble.marked.isHidden() and bubble.body.isHidden()
    assert bubble.marked.toPlainText() == rendered(record.text)  # Markdown, with the tints on top
    assert not first.chat_pane.legend.isHidden()
    bubble.copy_button.click()
    assert QGuiApplication.clipboard().text() == record.text
    first.close()

    second = make_window(AppSettings.load())
    assert second.menus.show_lookahead_action.isChecked()
    again = second.chat_view.bubbles()[-1]
    assert again.marks is not None and again.marks.runs == runs
    assert again.marked is not None and again.marked.toPlainText() == rendered(record.text)
    second.menus.show_lookahead_action.setChecked(False)  # back to Markdown
    assert not again.body.isHidden() and again.marked.isHidden()
    assert second.chat_pane.legend.isHidden()
    assert AppSettings.load().show_lookahead is False


def rendered(text: str) -> str:
    """``text`` as the chat shows Markdown."""
    from app.widgets.markdown_view import MarkdownView

    view = MarkdownView()
    view.set_markdown(text)
    shown = view.toPlainText()
    view.deleteLater()
    return shown


@pytest.mark.usefixtures("app_home")
def test_messages_stored_before_marks_existed_still_load(qtbot, tmp_path):
    import sqlite3

    from app.store import ChatStore
    from app.widgets.chat_pane import ChatPane

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL"
        " DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES"
        " conversations(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL, created REAL NOT NULL,"
        " stats_json TEXT);"
        "INSERT INTO conversations VALUES (1, 'old', '', 0, 0);"
        "INSERT INTO messages VALUES (1, 1, 'user', 'hi', 0, NULL), (2, 1, 'assistant', 'hello', 0, NULL);"
        "PRAGMA user_version=1;"
    )
    db.close()
    store = ChatStore(path)
    messages = store.messages(1)
    assert [m.marks_json for m in messages] == [None, None]
    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.set_show_lookahead(True)
    pane.show_messages(messages)
    reply = pane.chat_view.bubbles()[-1]
    assert reply.marks is None and not reply.body.isHidden() and reply.text() == "hello"
    store.close()


def test_the_compare_panes_lookahead_text_is_tinted_by_source_and_redrawn_when_switched(qtbot):
    from app.widgets.compare_view import CompareView
    from app.widgets.marked_text import source_colour

    view = CompareView()
    qtbot.addWidget(view)
    pane = view.lookahead_pane
    view.set_show_lookahead(True)
    assert not view.legend.isHidden()
    pane.advance([event(0, ("Hello",), (OWN,), batch=1), event(1, (" big", " world"), ("prompt", OWN))], 0.1)
    pane.advance([event(1, ("!",), (OWN,))], 0.2)
    assert pane.text.toPlainText() == "Hello big world!"

    def backgrounds() -> dict[str, str]:
        out = {}
        it = pane.text.document().firstBlock().begin()
        while not it.atEnd():
            f = it.fragment()
            fmt = f.charFormat()
            tinted = fmt.hasProperty(QTextFormat.Property.BackgroundBrush)
            out[f.text()] = fmt.background().color().name() if tinted else ""
            it += 1
        return out

    assert backgrounds()[" big"] == present(source_colour("prompt", False)).name()
    view.set_show_lookahead(False)  # drawn again, plain
    assert pane.text.toPlainText() == "Hello big world!" and set(backgrounds().values()) == {""}
    assert view.legend.isHidden()
