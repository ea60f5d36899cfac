"""Persistence and statistics of the app (no Qt needed)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app import paths
from app.settings import MAX_RECENT_MODELS, AppSettings
from app.stats import ReplyStats
from app.store import SCHEMA_VERSION, ChatStore, SchemaTooNewError, export_markdown
from engine import StepEvent


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


def test_all_files_go_under_lookahead_chat_home_when_it_is_set(home):
    assert paths.database_path().parent == home / "data"
    assert paths.settings_path().parent == home / "config"
    assert paths.database_path().parent.is_dir() and paths.settings_path().parent.is_dir()


def test_a_new_database_is_in_wal_mode_with_the_current_schema_version(home):
    store = ChatStore()
    assert store.journal_mode() == "wal"
    assert store.schema_version() == SCHEMA_VERSION >= 1
    store.close()


def test_a_database_from_a_newer_app_is_refused_rather_than_damaged(home):
    db = sqlite3.connect(paths.database_path())
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(SchemaTooNewError):
        ChatStore()


def test_conversations_and_messages_round_trip_and_deleting_a_chat_deletes_its_messages(home):
    store = ChatStore()
    a = store.create_conversation("First", "Be brief.")
    b = store.create_conversation("Second")
    store.add_message(a.id, "user", "hi")
    store.add_message(a.id, "assistant", "hello", stats_json='{"n_tokens": 1}')
    store.rename_conversation(b.id, "Renamed")
    store.set_system_prompt(b.id, "Be kind.")
    store.close()

    store = ChatStore()
    assert [c.title for c in store.conversations()] == ["First", "Renamed"]  # most recently updated first
    assert store.conversation(b.id).system_prompt == "Be kind."
    assert [(m.role, m.content, m.stats_json) for m in store.messages(a.id)] == [
        ("user", "hi", None),
        ("assistant", "hello", '{"n_tokens": 1}'),
    ]
    store.delete_conversation(a.id)
    assert store.messages(a.id) == []
    assert [c.id for c in store.conversations()] == [b.id]
    store.close()


def test_deleting_from_a_message_removes_it_and_everything_after_it_only(home):
    store = ChatStore()
    c = store.create_conversation("c")
    other = store.create_conversation("other")
    ids = [store.add_message(c.id, role, str(i)).id for i, role in enumerate(["user", "assistant"] * 3)]
    keep = store.add_message(other.id, "user", "elsewhere")
    assert store.delete_messages_from(c.id, ids[2]) == 4
    assert [m.content for m in store.messages(c.id)] == ["0", "1"]
    assert store.messages(other.id) == [keep]
    store.close()


def test_a_chat_exports_as_markdown_with_its_system_prompt_and_stats(home):
    store = ChatStore()
    c = store.create_conversation("Sea poems", "You are a poet.")
    store.add_message(c.id, "user", "A haiku, please.")
    stats = ReplyStats(n_tokens=12, steps=8, decode_s=0.2, first_token_s=0.05, modes=["lookahead"], window=4,
                       ngram=4, guesses=3, model="SmolLM2", stop_reason="eog")
    store.add_message(c.id, "assistant", "Waves fold on the shore", stats.to_json())
    text = export_markdown(store.conversation(c.id), store.messages(c.id))
    store.close()
    assert text.startswith("# Sea poems\n")
    assert "> **System:** You are a poet." in text
    assert "## User\n\nA haiku, please." in text
    assert "## Assistant\n\nWaves fold on the shore" in text
    assert "60.0 tok/s" in text and "lookahead W4 N4 G3" in text and "SmolLM2" in text


def test_settings_survive_a_save_and_load(home):
    s = AppSettings(model_path="/m/a.gguf", window=7, ngram=5, guesses=2, lookahead_on=False, auto=True,
                    temperature=0.7, seed=42, n_ctx=2048, threads=2, system_prompt="Hi")
    for i in range(MAX_RECENT_MODELS + 3):
        s.add_recent_model(f"/m/{i}.gguf")
    s.add_recent_model("/m/3.gguf")
    s.save()
    loaded = AppSettings.load()
    assert loaded == s
    assert loaded.recent_models[0] == "/m/3.gguf" and len(loaded.recent_models) == MAX_RECENT_MODELS
    assert len(set(loaded.recent_models)) == MAX_RECENT_MODELS


def test_an_unreadable_or_mistyped_settings_file_falls_back_to_defaults(home):
    paths.settings_path().write_text("{not json", encoding="utf-8")
    assert AppSettings.load() == AppSettings()
    paths.settings_path().write_text(json.dumps({"window": "wide", "ngram": 6, "lookahead_on": 1}), encoding="utf-8")
    loaded = AppSettings.load()
    assert (loaded.window, loaded.ngram, loaded.lookahead_on) == (AppSettings().window, 6, True)


def _ev(step, mode, n, drafted=0, accepted=0, window=4, elapsed=0.01, prefill=0.0, reason=None):
    return StepEvent(step=step, mode=mode, token_ids=(7,) * n, text="x" * n, n_committed=n, batch_size=1,
                     n_logits=1, n_drafted=drafted, n_accepted=accepted, n_reevaluated=0, window=window, ngram=4,
                     guesses=3, elapsed_s=elapsed, decode_s=elapsed, prefill_s=prefill, stop_reason=reason)


def test_reply_stats_add_up_the_steps_of_a_reply():
    stats = ReplyStats()
    for ev in [_ev(0, "lookahead", 1, 6, 0, prefill=0.1), _ev(1, "lookahead", 3, 6, 2, window=8),
               _ev(2, "plain", 2), _ev(3, "none", 0, elapsed=0.0, reason="cancelled")]:
        stats.observe(ev)
    assert stats.n_tokens == 6 and stats.steps == 3
    assert stats.per_step == [1, 3, 2]
    assert stats.tokens_per_step == 2.0
    assert stats.tokens_per_s == pytest.approx(6 / 0.03)
    assert stats.first_token_s == pytest.approx(0.11)
    assert stats.acceptance == pytest.approx(2 / 12)
    assert stats.mode == "mixed" and stats.window == 8
    assert stats.stop_reason == "cancelled"
    assert "stopped" in stats.summary_line()
    loaded = ReplyStats.from_json(stats.to_json())
    assert loaded.to_json() == stats.to_json() and loaded.summary_line() == stats.summary_line()
    assert loaded.token_ids == [] and loaded.n_tokens == 6  # the message keeps the text; its stats keep the counts
    assert ReplyStats.from_json("garbage") is None and ReplyStats.from_json(None) is None


# A message's stats exactly as the app stored them before the counting moved to engine.measure.RunStats.
STORED_BEFORE_RUNSTATS = (
    '{"n_tokens": 48, "steps": 32, "decode_s": 0.5, "first_token_s": 0.08, "n_drafted": 60, "n_accepted": 16, '
    '"modes": ["lookahead"], "window": 4, "ngram": 4, "guesses": 3, "auto": false, "model": "SmolLM2", '
    '"stop_reason": "max_tokens", "per_step": [1, 2, 1], "elapsed_s": 0.56}'
)


def test_stats_stored_by_an_earlier_version_load_and_read_the_same():
    stats = ReplyStats.from_json(STORED_BEFORE_RUNSTATS)
    assert stats is not None
    assert stats.summary_line() == (
        "48 tokens · 96.0 tok/s · TTFT 0.08 s · 1.50 tok/step · lookahead W4 N4 G3 · accepted 27% · SmolLM2 · "
        "length limit"
    )
    assert stats.prefill_s == pytest.approx(0.06)
    assert stats.to_json() == STORED_BEFORE_RUNSTATS  # and are written back byte for byte
