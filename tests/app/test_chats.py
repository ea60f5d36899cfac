"""Chats as a whole: alternatives (‹ 2/3 ›), forks, search across chats, and the JSON backup.

The window runs on a fake engine (it replies "Reply 1.", "Reply 2.", … at once), so these tests
load no model.
"""

from __future__ import annotations

import json
import time
from functools import partial

import pytest
from PySide6.QtCore import Qt

from app.attachments import Attachment, ReplySources
from app.backup import FORMAT, VERSION, BackupError, export_json, import_json
from app.main_window import MainWindow
from app.settings import AppSettings
from app.stats import ReplyStats
from app.store import ChatStore
from app.widgets.message_bubble import FLASH_MS, MessageBubble
from engine import GenerationControls, StepEvent
from engine.documents import Citation
from tests.helpers import app_fixtures
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine
from tests.helpers.optional import present

pytestmark = OFFSCREEN_NOISE

TIMEOUT_MS = 10_000
send = partial(app_fixtures.send, timeout_ms=TIMEOUT_MS)
click_and_wait = partial(app_fixtures.click_and_wait, timeout_ms=TIMEOUT_MS)


class _NumberedSession:
    """Replies "Reply 1.", "Reply 2.", … a word a step, and keeps every conversation it was asked to answer."""

    asked: list[list[tuple[str, str]]] = []
    step_delay_s = 0.0
    replies = 0

    def __init__(self, engine) -> None:
        self.engine = engine

    def reply(self, messages, controls: GenerationControls, sampling=None, stop=None, drafts_from=()):
        _NumberedSession.replies += 1
        _NumberedSession.asked.append([(m.role, m.content) for m in messages])
        words = ["Reply", f" {_NumberedSession.replies}", "."]

        def events():
            for step, word in enumerate(words):
                if controls.cancel.is_set():
                    yield _step(step, "", "cancelled")
                    return
                time.sleep(self.step_delay_s)
                yield _step(step, word, "eog" if step == len(words) - 1 else None)

        return events()


def _step(step: int, word: str, reason: str | None) -> StepEvent:
    n = 1 if word else 0
    return StepEvent(
        step=step, mode="plain" if n else "none", token_ids=(step + 1,) * n, text=word, n_committed=n,
        batch_size=1, n_logits=1, n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0, guesses=0,
        elapsed_s=0.001 * n, decode_s=0.001 * n, stop_reason=reason, token_texts=(word,) * n,
        token_sources=("own",) * n,
    )


@pytest.fixture
def numbered_engine(worker_options):
    _NumberedSession.asked = []
    _NumberedSession.replies = 0
    _NumberedSession.step_delay_s = 0.0
    use_fake_engine(worker_options, _NumberedSession)


def shown(window: MainWindow) -> list[tuple[str, str, str]]:
    """The bubbles as (role, text, "k/n" or "")."""
    return [(b.role, b.text(), b.alternative_text()) for b in window.chat_view.bubbles()]


# --- alternatives ---


def test_regenerate_keeps_the_old_reply_one_flip_away_and_both_survive_a_restart(qtbot, make_window, numbered_engine):
    window = make_window(quick_settings())
    first = send(qtbot, window, "Tell me a joke.")
    assert first.text == "Reply 1."
    second = click_and_wait(qtbot, window, window.chat_view.bubbles()[-1].regenerate_button)
    assert second.text == "Reply 2."
    assert shown(window) == [("user", "Tell me a joke.", ""), ("assistant", "Reply 2.", "2/2")]

    window.chat_view.bubbles()[-1].previous_button.click()
    assert shown(window) == [("user", "Tell me a joke.", ""), ("assistant", "Reply 1.", "1/2")]
    assert not window.chat_view.bubbles()[-1].previous_button.isEnabled()
    window.close()

    again = make_window(AppSettings.load())
    assert again.current_conversation_id() == first.conversation_id
    assert shown(again) == [("user", "Tell me a joke.", ""), ("assistant", "Reply 1.", "1/2")]
    again.chat_view.bubbles()[-1].next_button.click()
    assert shown(again) == [("user", "Tell me a joke.", ""), ("assistant", "Reply 2.", "2/2")]


def test_the_chat_goes_on_from_the_alternative_shown(qtbot, make_window, numbered_engine):
    window = make_window(quick_settings())
    send(qtbot, window, "Pick a number.")
    click_and_wait(qtbot, window, window.chat_view.bubbles()[-1].regenerate_button)
    window.chat_view.bubbles()[-1].previous_button.click()

    record = send(qtbot, window, "Why that one?")

    assert _NumberedSession.asked[-1][-3:] == [
        ("user", "Pick a number."), ("assistant", "Reply 1."), ("user", "Why that one?")]
    assert shown(window) == [("user", "Pick a number.", ""), ("assistant", "Reply 1.", "1/2"),
                             ("user", "Why that one?", ""), ("assistant", record.text, "")]
    window.chat_view.bubbles()[1].next_button.click()  # the other reply's branch has no follow-up
    assert shown(window) == [("user", "Pick a number.", ""), ("assistant", "Reply 2.", "2/2")]


def test_edit_and_resend_keeps_the_old_branch_one_flip_away(qtbot, make_window, numbered_engine):
    window = make_window(quick_settings())
    send(qtbot, window, "What is 2+2?")
    record = send(qtbot, window, "And 3+3?")

    window.chat_view.bubbles()[0].edit_button.click()
    assert window.input.toPlainText() == "What is 2+2?"
    assert window.edit_banner.isVisible()
    edited = send(qtbot, window, "What is 5+5?")

    assert not window.edit_banner.isVisible()
    assert shown(window) == [("user", "What is 5+5?", "2/2"), ("assistant", edited.text, "")]
    assert _NumberedSession.asked[-1][-1] == ("user", "What is 5+5?")
    assert ("user", "And 3+3?") not in _NumberedSession.asked[-1]
    window.chat_view.bubbles()[0].previous_button.click()
    assert [(role, text) for role, text, _ in shown(window)] == [
        ("user", "What is 2+2?"), ("assistant", "Reply 1."), ("user", "And 3+3?"), ("assistant", record.text)]
    assert shown(window)[0][2] == "1/2"


def test_fork_opens_a_new_chat_with_the_conversation_down_to_that_message(qtbot, make_window, numbered_engine):
    window = make_window(quick_settings())
    first = send(qtbot, window, "Plan a trip.")
    send(qtbot, window, "Make it shorter.")
    original = window.store.messages(first.conversation_id)

    window.chat_view.bubbles()[1].fork_button.click()

    fork_id = window.current_conversation_id()
    assert fork_id != first.conversation_id
    assert window.store.conversation(fork_id).title == "Plan a trip. (fork)"
    assert shown(window) == [("user", "Plan a trip.", ""), ("assistant", "Reply 1.", "")]
    assert window.conversations.titles() == ["Plan a trip. (fork)", "Plan a trip."]
    assert window.store.messages(first.conversation_id) == original
    send(qtbot, window, "Now by train.")  # the fork is a chat like any other
    assert len(window.store.messages(fork_id)) == 4


def test_flipping_forking_and_searching_wait_while_a_reply_streams(qtbot, make_window, numbered_engine):
    window = make_window(quick_settings())
    send(qtbot, window, "One.")
    click_and_wait(qtbot, window, window.chat_view.bubbles()[-1].regenerate_button)
    _NumberedSession.step_delay_s = 0.3
    window.input.setPlainText("Two.")
    with qtbot.waitSignal(window.replyStepReceived, timeout=TIMEOUT_MS):
        window.send_button.click()

    bubbles = window.chat_view.bubbles()
    assert bubbles[1].alternative_text() == "2/2"
    assert not any(b.fork_button.isEnabled() or b.previous_button.isEnabled() for b in bubbles)
    assert not window.runner.search_action.isEnabled() and not window.runner.find_action.isEnabled()
    with qtbot.waitSignal(window.replyCompleted, timeout=TIMEOUT_MS):
        window.menus.stop_action.trigger()
    assert window.chat_view.bubbles()[1].previous_button.isEnabled()
    assert window.runner.search_action.isEnabled()


# --- search ---


def _chats_with_a_hidden_match(store: ChatStore) -> tuple[int, int, int]:
    """Three chats; in the long one the word "axolotl" is deep in a branch that is not the one shown.

    Returns (that chat's id, the matching message's id, the id of the reply that branch starts with).
    """
    for title in ("Cooking", "Travel"):
        conv = store.create_conversation(title)
        store.add_message(conv.id, "user", f"Tell me about {title.lower()}.")
        store.add_message(conv.id, "assistant", "Gladly.\n\nSome words.")
    long = store.create_conversation("Animals")
    question = store.add_message(long.id, "user", "Name a salamander.")
    branch = store.add_message(long.id, "assistant", "The axolotl.")
    match = 0
    for k in range(20):
        store.add_message(long.id, "user", f"Question {k}?\n\nWith a second paragraph.")
        text = "The axolotl keeps its gills all its life." if k == 14 else "Also long enough\n\nto need scrolling."
        answer = store.add_message(long.id, "assistant", f"Answer {k}.\n\n{text}")
        match = answer.id if k == 14 else match
    store.add_message(long.id, "assistant", "The fire salamander.", parent_id=question.id)  # the one shown
    return long.id, match, branch.id


def _in_view(window: MainWindow, bubble: MessageBubble) -> bool:
    view = window.chat_view
    top = view.verticalScrollBar().value()
    return top <= bubble.y() and bubble.y() + 20 <= top + view.viewport().height()


@pytest.mark.timing
def test_ctrl_shift_f_finds_a_word_in_any_chat_and_opens_its_message_on_its_branch_highlighted(
    qtbot, app_home, make_window, numbered_engine
):
    store = ChatStore()
    animals, hidden, branch = _chats_with_a_hidden_match(store)
    store.close()
    window = make_window(quick_settings())
    window.conversations.list.setCurrentRow(window.conversations.titles().index("Travel"))
    assert window.runner.search_action.shortcut().toString() == "Ctrl+Shift+F"

    window.runner.search_action.trigger()
    dialog = window.runner.search_dialog
    assert dialog is not None and dialog.isVisible() and not dialog.this_chat_only.isChecked()
    qtbot.keyClicks(dialog.input, "axolotl gills")
    assert dialog.hits() == [(animals, hidden)]
    html = dialog.results.item(0).data(Qt.ItemDataRole.DisplayRole)
    assert "<b>Animals</b>" in html and "<b>axolotl</b> keeps its <b>gills</b>" in html
    qtbot.keyClick(dialog.input, Qt.Key.Key_Return)

    assert window.current_conversation_id() == animals
    assert window.chat_view.bubble_for(branch).alternative_text() == "1/2"  # the match's branch is shown
    assert len(window.chat_view.bubbles()) == 42
    bubble = window.chat_view.bubble_for(hidden)
    assert bubble is not None and bubble.highlighted
    view = window.chat_view  # once the Markdown has laid out, the chat is far taller than the view
    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 3 * view.viewport().height(), timeout=FLASH_MS)
    assert _in_view(window, bubble), (view.verticalScrollBar().value(), bubble.y())
    qtbot.waitUntil(lambda: not bubble.highlighted, timeout=FLASH_MS + 2000)
    assert window.store.messages(animals)[-1].content.startswith("Answer 19")


def test_ctrl_f_searches_the_open_chat_in_its_order_and_enter_goes_to_the_next_match(
    qtbot, app_home, make_window, numbered_engine
):
    store = ChatStore()
    animals, _match, _branch = _chats_with_a_hidden_match(store)
    store.close()
    window = make_window(quick_settings())
    window.conversations.list.setCurrentRow(window.conversations.titles().index("Animals"))

    window.runner.find_action.trigger()
    dialog = window.runner.search_dialog
    assert dialog.this_chat_only.isChecked()
    qtbot.keyClicks(dialog.input, "answer")
    found = [message_id for _conv, message_id in dialog.hits()]
    answers = [m.id for m in window.store.tree(animals) if m.content.startswith("Answer")]
    assert found == answers  # only this chat's (on any branch), top to bottom
    qtbot.keyClick(dialog.input, Qt.Key.Key_Return)
    qtbot.keyClick(dialog.input, Qt.Key.Key_Return)
    assert window.chat_view.bubble_for(answers[1]).highlighted
    dialog.input.setText('"gladly')  # another chat's word, with a stray quote
    assert dialog.hits() == [] and "No message in this chat" in dialog.status.text()
    dialog.this_chat_only.setChecked(False)
    assert len(dialog.hits()) == 2


# --- JSON backup ---


def _chats_with_every_kind_of_message(store: ChatStore) -> None:
    stats = ReplyStats(n_tokens=5, steps=3, decode_s=0.25, first_token_s=0.125, model="SmolLM2",
                       stop_reason="eog", prompt_tokens=40, per_step=[1, 2, 2]).to_stats_json()
    conv = store.create_conversation("Branches", "You are terse.")
    store.set_conversation_settings(conv.id, {"temperature": 0.7, "seed": 3})
    q = store.add_message(conv.id, "user", "Ünïcödé and \"quotes\"\n\n```py\nx = 1\n```")
    store.add_message(conv.id, "assistant", "first", stats, '[[5, "own", 0, 1]]')
    shown_reply = store.add_message(conv.id, "assistant", "second", stats, '[[3, "prompt", 1, 4], [3, "own", 1, 4]]',
                                    parent_id=q.id)
    edited = store.add_message(conv.id, "user", "edited", parent_id=None,  # an alternative first message, with files
                               attachments=[Attachment("ñotes.md", "markdown", 30, "# Ñotes\nline", path="/d/ñotes.md"),
                                            Attachment("book.pdf", "pdf", 9000, "p1 p2", (0, 3), tokens=4)])
    store.set_placed_documents(edited.id, ReplySources((Citation("book.pdf", "page 2", "p2"),),
                                                       {"ñotes.md": 1.0, "book.pdf": 0.5}, False, "## book.pdf\np2"))
    store.select_branch(shown_reply.id)
    store.create_conversation("Empty")


def _chat_as_saved(store: ChatStore, conversation_id: int) -> tuple:
    """Everything about a chat but its ids: its fields, and each message with its parent as a position."""
    conv = present(store.conversation(conversation_id))
    tree = store.tree(conversation_id)
    position: dict[int | None, int] = {m.id: k for k, m in enumerate(tree)}  # a root's parent (None) has none
    messages = [(position.get(m.parent_id), m.role, m.content, m.created, m.stats_json, m.marks_json, m.attachments,
                 m.documents) for m in tree]
    shown = [position[m.id] for m in store.messages(conversation_id)]
    return (conv.title, conv.system_prompt, conv.created, conv.updated, store.conversation_settings(conversation_id),
            messages, shown)


def test_json_export_then_import_round_trips_every_message_its_stats_marks_files_and_the_tree(app_home):
    source = ChatStore(":memory:")
    _chats_with_every_kind_of_message(source)
    text = export_json(source)
    document = json.loads(text)
    assert (document["format"], document["version"]) == (FORMAT, VERSION) == ("lookahead-chat", 1)
    assert document["conversations"][1]["messages"][1]["stats"]["n_tokens"] == 5

    target = ChatStore(":memory:")
    imported = import_json(target, text)
    assert [c.title for c in imported] == ["Empty", "Branches"]
    before = [_chat_as_saved(source, c.id) for c in source.conversations()]
    after = [_chat_as_saved(target, c.id) for c in imported]
    assert after == before
    assert len(before[1][5]) == 4 and before[1][6] == [0, 2]
    assert [len(m[6]) for m in before[1][5]] == [0, 0, 0, 2] and before[1][5][3][7].coverage["book.pdf"] == 0.5

    again = import_json(target, text)  # importing twice never overwrites: two more chats
    assert len(target.conversations()) == 4 and not {c.id for c in again} & {c.id for c in imported}
    assert [_chat_as_saved(target, c.id) for c in again] == before


@pytest.mark.parametrize("text, says", [
    ("not json", "not JSON"),
    ('{"format": "something-else"}', "not a Lookahead Chat export"),
    ('{"format": "lookahead-chat", "version": 2, "conversations": [{"title": "t", "messages": []}]}', "newer"),
    ('{"format": "lookahead-chat", "version": 1, "conversations": [{"title": "t", "messages": '
     '[{"id": 1, "parent": null, "role": "user", "content": "a", "created": 1}, '
     '{"id": 2, "parent": 1, "role": "robot", "content": "b", "created": 2}]}]}', "unknown role"),
    ('{"format": "lookahead-chat", "version": 1, "conversations": [{"title": "t", "messages": '
     '[{"id": 2, "parent": 1, "role": "user", "content": "a", "created": 1}]}]}', "parent"),
    ('{"format": "lookahead-chat", "version": 1, "conversations": [{"title": "t", "messages": '
     '[{"id": 1, "parent": null, "role": "user", "content": "a", "created": 1, "attachments": [{"name": "x"}]}]}]}',
     "attached file"),
    ('{"format": "lookahead-chat", "version": 1, "conversations": [{"title": "t", "messages": '
     '[{"id": 1, "parent": null, "role": "user", "content": "a", "created": 1, "documents": {"text": "t"}}]}]}',
     "documents"),
])
def test_a_file_that_is_not_a_valid_export_is_refused_whole_with_the_reason(text, says):
    store = ChatStore(":memory:")
    store.create_conversation("mine")
    good = '{"title": "good", "messages": []}'
    with pytest.raises(BackupError, match=says):
        import_json(store, text.replace('"conversations": [', f'"conversations": [{good}, '))
    assert [c.title for c in store.conversations()] == ["mine"]  # not even the good chat before the bad one


def test_the_file_menu_exports_and_imports_json_and_explains_a_bad_file(
    qtbot, make_window, numbered_engine, dialogs, monkeypatch, tmp_path
):
    from PySide6.QtWidgets import QFileDialog

    window = make_window(quick_settings())
    record = send(qtbot, window, "Keep this.")
    file_menu = window.menus.export_action.parent()
    texts = [a.text() for a in file_menu.actions()]
    assert texts.index("&Export chat as Markdown…") < texts.index("Export chat as &JSON…") < texts.index("&Quit")
    assert {"Export &all chats as JSON…", "&Import chats from JSON…"} <= set(texts)

    saved = tmp_path / "all.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(saved), "")))
    window.runner.export_all_json_action.trigger()
    exported = json.loads(saved.read_text(encoding="utf-8"))
    assert [m["content"] for m in exported["conversations"][0]["messages"]] == ["Keep this.", record.text]

    opened = [saved]
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(opened[-1]), "")))
    window.runner.import_json_action.trigger()
    assert window.conversations.titles() == ["Keep this.", "Keep this."]
    assert dialogs.shown == []

    opened.append(tmp_path / "broken.json")
    opened[-1].write_text('{"format": "lookahead-chat", "version": 1, "conversations": [{"title": 3}]}')
    window.runner.import_json_action.trigger()
    ((kind, title, text),) = dialogs.shown
    assert kind == "warning" and title == "Import failed" and "Nothing was imported" in text and "title" in text
    assert len(window.conversations.titles()) == 2
    assert send(qtbot, window, "Still here?").text  # the app goes on
