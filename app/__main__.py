"""Entry point: ``python -m app`` / ``lookahead-chat``.

``--self-test`` opens the real window, types a fixed prompt and presses Send
with the bundled model, waits for the reply, optionally saves a screenshot,
prints the reply and its stats, and exits 0 (non-zero on any failure). With
``--compare`` it does the same in the comparison tab: one prompt through plain
and lookahead decoding, replayed side by side, then the speedup. It uses
a temporary data dir unless ``LOOKAHEAD_CHAT_HOME`` is set, so the user's chats
are never touched. ``--list-models [--json]`` prints the model library's scan (see
``engine/library/``) without importing Qt, so it works without a display.

Warnings go to stderr and to a size-capped log file in the data folder's ``logs`` (Help → Open log folder),
with uncaught exceptions' tracebacks: a bundled app has no terminal, and one that fails must leave a trace.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import logging
import logging.handlers
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Qt is imported only when the window opens, so --help and --list-models need no display
    from PySide6.QtWidgets import QApplication

SELF_TEST_PROMPT = "Write a haiku about the sea."

LOG_FILE_NAME = "lookahead-chat.log"
LOG_MAX_BYTES = 1024 * 1024  # then it rolls over to .1, .2, .3: at most 4 MiB of log on the user's disk
LOG_BACKUPS = 3
UNCAUGHT_LOGGER = "app.uncaught"  # writes to the log file only: the default hooks still print to stderr

log = logging.getLogger("app.__main__")  # not __name__: that is "__main__" under python -m app, outside "app"


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lookahead-chat", description="Chat with a local GGUF model, faster.")
    parser.add_argument("--self-test", action="store_true", help="send one prompt through the window and exit")
    parser.add_argument(
        "--compare", action="store_true", help="with --self-test: run one side-by-side comparison instead"
    )
    parser.add_argument("--screenshot", metavar="PATH", help="with --self-test: save the window to PATH")
    parser.add_argument("--prompt", default=SELF_TEST_PROMPT, help="with --self-test: the prompt to send")
    parser.add_argument("--timeout", type=float, default=120.0, help="with --self-test: seconds to wait")
    parser.add_argument("--max-tokens", type=int, default=128, help="with --self-test: longest reply")
    parser.add_argument(
        "--list-models", action="store_true",
        help="list the GGUF models found in other apps' folders and your added folders, then exit",
    )
    parser.add_argument("--json", action="store_true", help="with --list-models: one JSON object per line")
    return parser.parse_args(argv)


def _list_models(as_json: bool) -> int:
    """``--list-models``: the library's scan, printed; no Qt, so it works without a display."""
    import json

    from engine.library.folders import library_roots
    from engine.library.table import format_table
    from engine.library.walk import scan

    from .settings import AppSettings

    folders = AppSettings.load().library_folders
    result = scan(library_roots(folders))
    if as_json:
        for model in result.models:
            print(json.dumps(model.to_json()))
    else:
        print(format_table(result.models))
    for skipped in result.skipped:
        print(f"skipped: {skipped.path}: {skipped.reason}", file=sys.stderr)
    return 0


def setup_logging(max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> Path | None:
    """Warnings to stderr and to a rotating log file in ``paths.log_dir()``; uncaught exceptions to the file too.

    The app's own loggers also write INFO (the start record, closing times) to the file. Returns the log file's
    path, or None when its folder cannot be written: then the app runs on with stderr only, and says so there.
    """
    from . import paths

    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    if sys.stderr is not None:  # a windowed bundle (PyInstaller on Windows) has no stderr at all
        console = logging.StreamHandler()
        console.setLevel(logging.WARNING)
        console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(console)
    try:
        path = paths.log_dir() / LOG_FILE_NAME
        file = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    except OSError as exc:  # a read-only or full disk: no log file, but the app must still start
        log.warning("no log file, logging to stderr only: %s", exc)
        return None
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"))
    root.addHandler(file)
    logging.getLogger("app").setLevel(logging.INFO)
    uncaught = logging.getLogger(UNCAUGHT_LOGGER)
    uncaught.propagate = False
    uncaught.addHandler(file)
    _log_uncaught_exceptions(uncaught)
    return path


def _log_uncaught_exceptions(uncaught: logging.Logger) -> None:
    """Uncaught exceptions (main thread, Qt slots, other threads) go to the log file, then to the previous hook."""
    previous_hook, previous_thread_hook = sys.excepthook, threading.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            uncaught.critical("uncaught exception", exc_info=(kind, exc, tb))
        previous_hook(kind, exc, tb)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not issubclass(args.exc_type, SystemExit):  # the default ignores those
            name = args.thread.name if args.thread is not None else "?"
            uncaught.critical("uncaught exception in thread %s", name,
                              exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
        previous_thread_hook(args)

    sys.excepthook, threading.excepthook = hook, thread_hook


def _log_start(qt_version: str, pyside_version: str) -> None:
    """One line that makes a log useful on its own: which app, on which Python, Qt and system."""
    try:
        version = importlib.metadata.version("lookahead-chat")
    except importlib.metadata.PackageNotFoundError:
        version = "(development copy)"
    kind = "bundled" if getattr(sys, "frozen", False) else "from source"
    log.info("Lookahead Chat %s (%s) starting: Python %s, Qt %s, PySide6 %s, %s", version, kind,
             platform.python_version(), qt_version, pyside_version, platform.platform())


def prepare_application(app: QApplication) -> None:
    """The application's name, icon and style sheet, and the wheel guard (the wheel scrolls, fields keep values)."""
    from PySide6.QtGui import QIcon

    from . import paths
    from .wheel_guard import install_wheel_guard

    app.setApplicationName("Lookahead Chat")
    app.setDesktopFileName("lookahead-chat")
    icon = paths.resources_dir() / "icons" / "lookahead-chat.svg"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    style = paths.resources_dir() / "styles" / "app.qss"
    if style.is_file():
        app.setStyleSheet(style.read_text(encoding="utf-8"))
    install_wheel_guard(app)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    from . import paths

    if args.self_test and not os.environ.get(paths.HOME_ENV):
        os.environ[paths.HOME_ENV] = tempfile.mkdtemp(prefix="lookahead-chat-selftest-")
    setup_logging()  # after the self-test's home is chosen: its log goes there too
    if args.list_models:
        return _list_models(args.json)

    # Qt is imported only now, so --help works without a display.
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import qVersion
    from PySide6.QtWidgets import QApplication

    from .main_window import MainWindow
    from .qt_compat import binding_problem

    _log_start(qVersion(), pyside_version)
    problem = binding_problem()
    if problem:
        print(f"lookahead-chat: {problem}", file=sys.stderr)
        return 3
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    prepare_application(app)

    window = MainWindow()
    window.show()
    # The modules and the window live as long as the app: kept out of the cyclic collector's full passes, which
    # would otherwise walk all of them in the middle of a reply (tens of ms with Qt loaded, every few hundred steps).
    gc.freeze()
    if not args.self_test:
        code = app.exec()
        window.close()
        return int(code)
    from .self_test import CompareSelfTest, SelfTest

    screenshot = Path(args.screenshot) if args.screenshot else None
    kind = CompareSelfTest if args.compare else SelfTest
    test = kind(window, args.prompt, screenshot, args.timeout, args.max_tokens)
    return test.run(app)


if __name__ == "__main__":
    sys.exit(main())
