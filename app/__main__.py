"""Entry point: ``python -m app`` / ``lookahead-chat``.

``--self-test`` opens the real window, types a fixed prompt and presses Send
with the bundled model, waits for the reply, optionally saves a screenshot,
prints the reply and its stats, and exits 0 (non-zero on any failure). With
``--compare`` it does the same in the comparison tab: one prompt through plain
and lookahead decoding, replayed side by side, then the speedup. It uses
a temporary data dir unless ``LOOKAHEAD_CHAT_HOME`` is set, so the user's chats
are never touched. ``--list-models [--json]`` prints the model library's scan (see
``engine/library.py``) without importing Qt, so it works without a display.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Qt is imported only when the window opens, so --help and --list-models need no display
    from PySide6.QtWidgets import QApplication

SELF_TEST_PROMPT = "Write a haiku about the sea."


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

    from engine.library import format_table, library_roots, scan

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
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.list_models:
        return _list_models(args.json)
    from . import paths

    if args.self_test and not os.environ.get(paths.HOME_ENV):
        os.environ[paths.HOME_ENV] = tempfile.mkdtemp(prefix="lookahead-chat-selftest-")

    # Qt is imported only now, so --help works without a display.
    from PySide6.QtWidgets import QApplication

    from .main_window import MainWindow
    from .qt_compat import binding_problem

    problem = binding_problem()
    if problem:
        print(f"lookahead-chat: {problem}", file=sys.stderr)
        return 3
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    prepare_application(app)

    window = MainWindow()
    window.show()
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
