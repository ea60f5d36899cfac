"""Chats are never lost: a kill mid-write, a corrupt file and a locked file are all survived (no model needed)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import paths  # noqa: E402
from app.store import MEMORY, ChatStore, DatabaseLockedError  # noqa: E402
from app.store import opening as store_opening
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings

ROOT = Path(__file__).resolve().parents[3]

WRITER = r"""
import sys
from app.store import ChatStore

store = ChatStore(sys.argv[1])
i = 0
while True:
    conv = store.create_conversation(f"chat {i}")
    for k in range(8):
        m = store.add_message(conv.id, "user" if k % 2 == 0 else "assistant", f"message {i}.{k} " + "x" * (37 * k))
        print(m.id, flush=True)  # reported saved: add_message has returned, so it is committed
    i += 1
"""


@pytest.mark.timing
def test_messages_reported_saved_survive_a_sigkill_and_the_database_stays_intact(tmp_path):
    db = tmp_path / "chats.sqlite3"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    reported: list[int] = []
    for run, kill_after in enumerate([40, 150, 333]):  # three kills at different points
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True, env=env,
                                cwd=ROOT)
        assert proc.stdout is not None
        seen = 0
        deadline = time.monotonic() + 60
        while seen < kill_after and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            reported.append(int(line))
            seen += 1
        proc.send_signal(signal.SIGKILL)  # mid-loop: quite possibly inside a transaction
        rest, _ = proc.communicate(timeout=10)
        reported += [int(x) for x in rest.split()]  # printed before the kill: reported saved too
        assert proc.returncode == -signal.SIGKILL
        assert seen == kill_after, f"run {run}: the writer stopped early"

        store = ChatStore(db)
        try:
            assert store.database.integrity_check() == "ok"
            assert store.database.recovered is None
            saved = {m.id for c in store.conversations() for m in store.messages(c.id)}
        finally:
            store.close()
        missing = sorted(set(reported) - saved)
        assert not missing, f"run {run}: {len(missing)} reported-saved messages lost, e.g. {missing[:5]}"


def test_the_store_syncs_every_commit_and_writes_a_message_and_its_chat_together(tmp_path, monkeypatch):
    store = ChatStore(tmp_path / "c.sqlite3")
    assert store.database.journal_mode() == "wal" and store.database.synchronous() == 2  # FULL
    conv = store.create_conversation("c")

    def fail(_conversation_id: int) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    with monkeypatch.context() as mp:
        mp.setattr(store, "_touch", fail)
        with pytest.raises(sqlite3.OperationalError):
            store.add_message(conv.id, "user", "half-written")
    assert store.messages(conv.id) == []  # rolled back with the failed update, not left behind
    assert store.add_message(conv.id, "user", "whole").content == "whole"
    store.close()


def _damaged_database(path: Path) -> bytes:
    store = ChatStore(path)
    conv = store.create_conversation("precious")
    for i in range(200):
        store.add_message(conv.id, "user", f"message {i} " + "text " * 40)
    store.close()
    data = bytearray(path.read_bytes())
    data[3 * 4096 : 4 * 4096] = bytes(range(256)) * 16  # one page of the messages table overwritten
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("damage", ["not a database", "a damaged page"])
def test_a_corrupt_database_is_kept_as_a_timestamped_backup_and_a_new_one_started(tmp_path, damage):
    path = tmp_path / "chats.sqlite3"
    if damage == "not a database":
        original = b"this is not an SQLite database\n" * 100
        path.write_bytes(original)
    else:
        original = _damaged_database(path)

    store = ChatStore(path)
    try:
        assert store.database.recovered is not None
        backup = store.database.recovered.backup
        assert backup.name.startswith("chats.sqlite3.corrupt-") and backup.read_bytes() == original
        assert str(backup) in store.database.recovered.message()
        assert store.conversations() == []
        conv = store.create_conversation("fresh start")
        store.add_message(conv.id, "user", "hello")
        assert store.database.integrity_check() == "ok"
    finally:
        store.close()
    assert ChatStore(path).database.recovered is None  # the new file is healthy


def _hold_lock(path: Path) -> sqlite3.Connection:
    """Another program holding an exclusive lock (a rollback-journal database mid-transaction)."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE IF NOT EXISTS t(x)")
    other.execute("BEGIN EXCLUSIVE")
    other.execute("INSERT INTO t VALUES (1)")
    return other


@pytest.mark.timing
def test_a_locked_database_is_reported_clearly_after_a_short_wait_and_left_untouched(tmp_path):
    path = tmp_path / "chats.sqlite3"
    other = _hold_lock(path)
    try:
        t0 = time.perf_counter()
        with pytest.raises(DatabaseLockedError, match="locked by another program"):
            ChatStore(path, busy_timeout_s=0.3)
        assert 0.25 < time.perf_counter() - t0 < 5
        assert not list(tmp_path.glob("*.corrupt-*"))  # a lock is not corruption: nothing moved
    finally:
        other.execute("ROLLBACK")
        other.close()
    ChatStore(path).close()  # usable once the other program lets go


def test_a_lock_held_briefly_is_waited_out(tmp_path):
    import threading

    path = tmp_path / "chats.sqlite3"
    other = _hold_lock(path)

    def release() -> None:
        other.execute("ROLLBACK")
        other.close()

    threading.Timer(0.3, release).start()
    store = ChatStore(path, busy_timeout_s=5)
    store.close()


# --- the app ---------------------------------------------------------------------------------------


@pytest.fixture
def bare_window(qtbot, app_home, dialogs):
    """Opens MainWindows without loading a model; closes them after the test."""
    from app.main_window import MainWindow

    windows = []

    def make():
        window = MainWindow(quick_settings(), load_model=False)
        windows.append(window)
        window.show()
        return window

    yield make
    for window in windows:
        window.close()
        window.deleteLater()


@OFFSCREEN_NOISE
def test_the_app_starts_on_a_corrupt_database_keeps_a_backup_and_says_where(qtbot, bare_window, dialogs):
    original = _damaged_database(paths.database_path())
    window = bare_window()
    qtbot.waitUntil(lambda: bool(dialogs.shown), timeout=5000)
    ((kind, title, text),) = dialogs.shown
    assert kind == "warning" and "damaged" in text
    (backup,) = paths.data_dir().glob("chats.sqlite3.corrupt-*")
    assert str(backup) in text and backup.read_bytes() == original
    assert window.conversations.titles() == []
    conv = window.store.create_conversation("after recovery")  # the new database works
    assert [c.title for c in window.store.conversations()] == ["after recovery"]
    assert window.store.database.path == paths.database_path() and conv.id


@OFFSCREEN_NOISE
def test_the_app_starts_on_a_locked_database_says_so_and_keeps_running(qtbot, bare_window, dialogs, monkeypatch):
    monkeypatch.setattr(store_opening, "BUSY_TIMEOUT_S", 0.2)
    path = paths.database_path()
    other = _hold_lock(path)
    try:
        window = bare_window()
        qtbot.waitUntil(lambda: bool(dialogs.shown), timeout=5000)
        ((kind, _title, text),) = dialogs.shown
        assert kind == "warning" and "locked by another program" in text and "will not be saved" in text
        assert window.store.database.path == MEMORY
        conv = window.store.create_conversation("this session")
        window.store.add_message(conv.id, "user", "still works")
        assert window.store.messages(conv.id)[0].content == "still works"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert not list(paths.data_dir().glob("*.corrupt-*"))


# --- private files ---------------------------------------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_the_data_and_config_dirs_are_private_to_the_user(app_home):
    old = os.umask(0o022)
    try:
        assert paths.data_dir().stat().st_mode & 0o777 == 0o700
        assert paths.config_dir().stat().st_mode & 0o777 == 0o700
        os.chmod(paths.data_dir(), 0o755)  # made by an older version
        assert paths.data_dir().stat().st_mode & 0o777 == 0o700
    finally:
        os.umask(old)
