"""The log file: size-capped, in the data folder, with tracebacks; Help → Open log folder shows it."""

from __future__ import annotations

import logging
import logging.handlers
import os
import platform
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6 import __version__ as pyside_version
from PySide6.QtCore import QUrl, qVersion
from PySide6.QtGui import QDesktopServices

from app import __main__ as app_main
from app.worker import EngineWorker
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, quick_settings, use_fake_engine


@dataclass
class LogSetup:
    """What ``setup_logging`` left behind in one test: the file (or None) and the hooks it installed."""

    path: Path | None
    excepthook: Callable = sys.excepthook
    thread_excepthook: Callable = threading.excepthook
    handlers: list[logging.Handler] = field(default_factory=list)

    def text(self) -> str:
        assert self.path is not None
        for handler in self.handlers:
            handler.flush()
        return self.path.read_text(encoding="utf-8")


@pytest.fixture
def setup_logging(app_home: Path) -> Iterator[Callable[..., LogSetup]]:
    """Runs the app's ``setup_logging``; afterwards the root logger, the levels and the hooks are as before.

    The hooks it installs are handed to the test and taken out of ``sys``/``threading`` at once, so pytest's and
    pytest-qt's own hooks stay in charge of the test run.
    """
    root, app_logger = logging.getLogger(), logging.getLogger("app")
    uncaught = logging.getLogger(app_main.UNCAUGHT_LOGGER)
    levels = root.level, app_logger.level
    setups: list[LogSetup] = []

    def run(**kwargs) -> LogSetup:
        before, hooks = list(root.handlers), (sys.excepthook, threading.excepthook)
        try:
            setup = LogSetup(app_main.setup_logging(**kwargs))
            setup.excepthook, setup.thread_excepthook = sys.excepthook, threading.excepthook
        finally:
            sys.excepthook, threading.excepthook = hooks
        setup.handlers = [h for h in root.handlers if h not in before]
        setups.append(setup)
        return setup

    yield run
    for setup in setups:
        for handler in setup.handlers:
            root.removeHandler(handler)
            uncaught.removeHandler(handler)
            handler.close()
    uncaught.propagate = True
    root.setLevel(levels[0])
    app_logger.setLevel(levels[1])


def test_the_log_file_is_in_the_data_folders_logs_and_starts_with_the_app_python_qt_and_os(setup_logging, app_home):
    setup = setup_logging()
    assert setup.path == app_home / "data" / "logs" / app_main.LOG_FILE_NAME
    assert setup.path.is_file()
    if os.name == "posix":
        assert setup.path.parent.stat().st_mode & 0o777 == 0o700  # private, like the chats

    app_main._log_start(qVersion(), pyside_version)
    (line,) = setup.text().splitlines()
    assert "Lookahead Chat" in line and "starting" in line
    for fact in (f"Python {platform.python_version()}", f"Qt {qVersion()}", f"PySide6 {pyside_version}",
                 platform.platform()):
        assert fact in line


def test_a_warning_logged_while_handling_an_exception_carries_its_traceback_into_the_file(setup_logging):
    setup = setup_logging()
    try:
        raise ValueError("the detail that explains it")
    except ValueError as exc:
        logging.getLogger("app.worker").warning("generation failed: %s", exc, exc_info=True)

    text = setup.text()
    assert "WARNING app.worker [MainThread]: generation failed: the detail that explains it" in text
    assert "Traceback (most recent call last):" in text
    assert 'raise ValueError("the detail that explains it")' in text  # the line it came from, not just its words


def test_a_failed_model_load_in_the_worker_is_logged_with_its_traceback(qapp, caplog):
    def unreadable(path, **_kwargs):
        raise OSError(f"cannot read {path}")

    worker = EngineWorker(check_loadable=unreadable)
    failures: list[str] = []
    worker.modelFailed.connect(failures.append)
    with caplog.at_level(logging.WARNING, logger="app.worker"):
        worker.loadModel("/nowhere/model.gguf", 256, 1)

    assert failures  # the user still gets the message
    (record,) = [r for r in caplog.records if r.getMessage().startswith("model load failed")]
    assert record.exc_info is not None and record.exc_info[0] is OSError
    assert "in unreadable" in caplog.text  # the traceback names the function that raised


def test_uncaught_exceptions_reach_the_file_then_the_hooks_that_were_there_before(setup_logging, monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: seen.append(f"sys: {exc}"))
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(f"thread: {args.exc_value}"))
    setup = setup_logging()
    assert setup.excepthook is not sys.excepthook and setup.thread_excepthook is not threading.excepthook

    try:
        raise RuntimeError("a slot's bug")
    except RuntimeError:
        setup.excepthook(*sys.exc_info())

    def crash() -> None:
        raise KeyError("reader-state")

    monkeypatch.setattr(threading, "excepthook", setup.thread_excepthook)  # as the app runs: this thread uses it
    thread = threading.Thread(target=crash, name="reader")
    thread.start()
    thread.join()

    assert seen == ["sys: a slot's bug", "thread: 'reader-state'"]  # the default output still happens
    text = setup.text()
    assert "CRITICAL app.uncaught [MainThread]: uncaught exception" in text
    assert 'raise RuntimeError("a slot\'s bug")' in text
    assert "uncaught exception in thread reader" in text
    assert "KeyError: 'reader-state'" in text
    assert text.count("Traceback (most recent call last):") == 2


def test_the_log_rolls_over_at_its_size_cap_and_keeps_only_so_many_old_files(setup_logging):
    setup = setup_logging(max_bytes=2_000, backups=2)
    assert setup.path is not None
    noisy = logging.getLogger("app.noisy")
    for i in range(200):  # about 20 kB: many times the cap
        noisy.warning("line %03d %s", i, "x" * 60)
    setup.text()

    files = sorted(p.name for p in setup.path.parent.iterdir())
    name = app_main.LOG_FILE_NAME
    assert files == [name, f"{name}.1", f"{name}.2"]
    assert all((setup.path.parent / f).stat().st_size <= 2_000 for f in files)
    assert "line 199" in setup.text()  # the newest lines are in the current file


def test_the_default_cap_is_a_few_megabytes_at_most():
    assert app_main.LOG_MAX_BYTES * (app_main.LOG_BACKUPS + 1) <= 4 * 1024 * 1024


@pytest.mark.parametrize("blocked", ["a file where the folder goes", "a folder that cannot be written"])
def test_a_log_folder_that_cannot_be_written_leaves_stderr_logging_and_says_so(setup_logging, app_home, monkeypatch,
                                                                               capsys, blocked):
    if blocked == "a file where the folder goes":  # also stops root, who may write anywhere else
        (app_home / "data").mkdir(parents=True)
        (app_home / "data" / "logs").write_text("not a folder")
    else:
        def read_only(path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(logging.handlers, "RotatingFileHandler", read_only)

    setup = setup_logging()

    assert setup.path is None
    assert [type(h) for h in setup.handlers] == [logging.StreamHandler]
    assert setup.excepthook is sys.excepthook  # nothing to write to: the default hooks stay
    assert "WARNING app.__main__: no log file, logging to stderr only:" in capsys.readouterr().err
    logging.getLogger("app.later").warning("still heard")
    assert "WARNING app.later: still heard" in capsys.readouterr().err


@pytest.fixture
def fake_engine(worker_options: dict) -> None:
    use_fake_engine(worker_options, lambda engine: SimpleNamespace())


def _recording_into(opened: list[QUrl]) -> Callable[[QUrl], bool]:
    """A stand-in for ``QDesktopServices.openUrl`` that keeps the URLs it is asked to open."""

    def open_url(url: QUrl) -> bool:
        opened.append(url)
        return True

    return open_url


@OFFSCREEN_NOISE
def test_help_open_log_folder_opens_the_log_folder_in_the_file_manager(make_window, fake_engine, app_home,
                                                                       monkeypatch):
    opened: list[QUrl] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(_recording_into(opened)))
    window = make_window(quick_settings())
    help_menu = window.menus.about_action.parent()
    assert window.menus.log_folder_action in help_menu.actions()
    assert window.menus.log_folder_action.text().replace("&", "") == "Open log folder"

    window.menus.log_folder_action.trigger()

    folder = app_home / "data" / "logs"
    assert opened == [QUrl.fromLocalFile(str(folder))]
    assert folder.is_dir()  # created if the app has not written a log yet


@OFFSCREEN_NOISE
def test_help_open_log_folder_says_why_when_the_folder_cannot_be_made(make_window, fake_engine, app_home,
                                                                      monkeypatch):
    opened: list[QUrl] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(_recording_into(opened)))
    window = make_window(quick_settings())
    (app_home / "data" / "logs").write_text("not a folder")

    window.menus.log_folder_action.trigger()

    assert opened == []
    assert window.statusBar().currentMessage().startswith("Could not open the log folder:")
