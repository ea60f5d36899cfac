"""Makes the layout screenshots in ``resources/screenshots/`` (not a test: pytest does not collect this file).

Run under a display (e.g. ``Xvfb :99 -screen 0 1600x1000x24 & DISPLAY=:99 python -m tests.helpers.make_screenshots``).
Each shot is the real window with a fake engine (``tests.helpers.app_fixtures.FakeEngine``) whose reply holds a code
block, at a laptop size, in the light and the dark colour scheme. Every shot runs in its own process: the
colour scheme is read when the widgets are made. ``--attachments`` makes ``attachments.png``: a message with a
PDF and a Python file attached, its reply's sources open, lookahead shown with text drafted from the files.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance
    from PySide6.QtGui import QPalette

    from app.main_window import MainWindow
    from engine import GenerationControls, Message, SamplingConfig, StepEvent, StopConfig
    from engine.documents import Document, DocumentContext

SIZES = ((1024, 700), (1366, 768))
SCHEMES = ("light", "dark")
OUT_DIR = Path(__file__).resolve().parents[2] / "resources" / "screenshots"
PROMPT = "How do I reverse the words of a sentence in Python?"
REPLY = (
    "Split the sentence into words, reverse the list, and join it again:\n\n"
    "```python\n"
    "def reverse_words(sentence: str) -> str:\n"
    "    \"\"\"'the quick fox' -> 'fox quick the'\"\"\"\n"
    "    return \" \".join(reversed(sentence.split()))\n"
    "\n"
    "print(reverse_words(\"the quick brown fox\"))\n"
    "```\n\n"
    "`split()` with no argument also drops repeated spaces, so the result has single spaces between words."
)


class CodeSession:
    """Replies ``REPLY`` a few characters a step, some steps committing several tokens as lookahead would."""

    def __init__(self, engine: object) -> None:
        self.engine = engine

    def reply(
        self, messages: Sequence[Message], controls: GenerationControls | None = None,
        sampling: SamplingConfig | None = None, stop: StopConfig | None = None, drafts_from: Sequence[str] = (),
    ) -> Iterator[StepEvent]:
        from engine import StepEvent

        pieces = [REPLY[i:i + 4] for i in range(0, len(REPLY), 4)]

        def events() -> Iterator[StepEvent]:
            for step, piece in enumerate(pieces):
                n = 1 + step % 3  # 1, 2 or 3 tokens a step
                last = step == len(pieces) - 1
                yield StepEvent(
                    step=step, mode="lookahead", token_ids=(1,) * n, text=piece, n_committed=n, batch_size=13,
                    n_logits=13, n_drafted=3, n_accepted=n - 1, n_reevaluated=0, window=4, ngram=4, guesses=3,
                    elapsed_s=0.02, decode_s=0.018, stop_reason="eog" if last else None,
                    token_texts=tuple(piece[k::n] for k in range(n)), token_sources=("own",) + ("prompt",) * (n - 1),
                )

        return events()


DOCS_PROMPT = "What does the warranty cover, and what does main() in tool.py return?"
DOCS_REPLY = (
    "The warranty covers **parts and labour for two years** from the date of purchase; batteries are covered "
    "for six months (manual.pdf, page 2).\n\n"
    "`main()` in tool.py returns `42`, the number of checks the tool runs."
)
# Which runs of DOCS_REPLY the fake drafts from the attached files: the words the files hold.
DOCS_DRAFTED = ("parts and labour for two years", "batteries are covered", "for six months", "returns `42`")
_FILLER = "\n".join(
    f"{k}. Keep the base dry, use the kettle on a flat surface, and unplug it before you move it." for k in range(1, 9)
)
MANUAL_PAGES = [
    "Model X200 kettle\nQuick start: fill, close the lid, press the switch.\n" + _FILLER,
    "Warranty\nThe warranty covers parts and labour for two years from the date of purchase.\n"
    "Batteries are covered for six months.\n" + _FILLER,
    "Cleaning\nDescale once a month with citric acid.\n" + _FILLER,
    "Safety\nNever immerse the base in water.\n" + _FILLER,
]
TOOL_PY = 'def main() -> int:\n    """Run the checks; returns how many ran."""\n    return 42\n'


class DocsSession:
    """Replies ``DOCS_REPLY``; the words the attached files hold come as accepted drafts from "document"."""

    def __init__(self, engine: object) -> None:
        self.engine = engine

    def documents_context(
        self, messages: Sequence[Message], docs: Sequence[Document], max_tokens: int,
    ) -> DocumentContext:
        """Less room than the files need (a word a token), so the passages matching the question go in."""
        from engine.documents import DocumentContext

        return DocumentContext.build(docs, messages[-1].content, 300, lambda text: len(text.split()))

    def reply(
        self, messages: Sequence[Message], controls: GenerationControls | None = None,
        sampling: SamplingConfig | None = None, stop: StopConfig | None = None, drafts_from: Sequence[str] = (),
        **_more: Any,
    ) -> Iterator[StepEvent]:
        from engine import StepEvent

        spans = sorted((DOCS_REPLY.index(d), DOCS_REPLY.index(d) + len(d)) for d in DOCS_DRAFTED)
        pieces: list[tuple[str, str]] = []
        at = 0
        for start, end in spans:
            pieces += [(DOCS_REPLY[i:min(i + 5, start)], "own") for i in range(at, start, 5)]
            pieces.append((DOCS_REPLY[start:end], "document"))
            at = end
        pieces += [(DOCS_REPLY[i:i + 5], "own") for i in range(at, len(DOCS_REPLY), 5)]

        def events() -> Iterator[StepEvent]:
            for step, (piece, source) in enumerate(pieces):
                n = 1 if source == "own" else 4  # a drafted run lands several tokens in one step
                cut = [piece[k * len(piece) // n:(k + 1) * len(piece) // n] for k in range(n)]
                yield StepEvent(
                    step=step, mode="lookahead", token_ids=(1,) * n, text=piece, n_committed=n, batch_size=13,
                    n_logits=13, n_drafted=4, n_accepted=n - 1, n_reevaluated=0, window=4, ngram=4, guesses=3,
                    elapsed_s=0.02, decode_s=0.018, stop_reason="eog" if step == len(pieces) - 1 else None,
                    token_texts=tuple(cut), token_sources=(source,) * n,
                    draft_origin="document" if source == "document" else "",
                )

        return events()


def dark_palette() -> QPalette:
    """A dark palette like a desktop's dark theme, for platforms whose theme has none."""
    from PySide6.QtGui import QColor, QPalette

    palette = QPalette()
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    for r, colour in (
        (role.Window, "#2b2b2e"), (role.WindowText, "#e6e6e6"), (role.Base, "#1e1e21"),
        (role.AlternateBase, "#34343a"), (role.Text, "#e6e6e6"), (role.Button, "#36363b"),
        (role.ButtonText, "#e6e6e6"), (role.Highlight, "#3d7bd9"), (role.HighlightedText, "#ffffff"),
        (role.ToolTipBase, "#34343a"), (role.ToolTipText, "#e6e6e6"), (role.Link, "#7fb0ff"),
        (role.PlaceholderText, "#8c8c93"), (role.Light, "#4a4a50"), (role.Midlight, "#3e3e44"),
        (role.Mid, "#2f2f33"), (role.Dark, "#18181a"), (role.Shadow, "#000000"), (role.BrightText, "#ff6b6b"),
    ):
        palette.setColor(r, QColor(colour))
    for r in (role.WindowText, role.Text, role.ButtonText):
        palette.setColor(group.Disabled, r, QColor("#85858c"))
    return palette


def shoot(width: int, height: int, scheme: str, out: Path, attachments: bool = False) -> None:
    """One screenshot: the window at ``width``×``height`` after one reply, in ``scheme`` (``attachments``: the
    reply about two attached files, its sources open, lookahead shown)."""
    os.environ["LOOKAHEAD_CHAT_HOME"] = tempfile.mkdtemp(prefix="lookahead-chat-shots-")
    from PySide6.QtCore import QEventLoop, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from app.__main__ import prepare_application
    from app.main_window import MainWindow
    from app.widgets.markdown_view import palette_is_dark
    from tests.helpers.app_fixtures import quick_settings, use_fake_engine

    app = QApplication(sys.argv[:1])
    if scheme == "dark":
        app.styleHints().setColorScheme(Qt.ColorScheme.Dark)
        if not palette_is_dark():  # a platform without a dark theme of its own (e.g. a bare X server)
            app.setStyle("Fusion")
            app.setPalette(dark_palette())
    prepare_application(app)
    if palette_is_dark() != (scheme == "dark"):
        raise SystemExit(f"the {scheme} colour scheme did not take on this platform")

    options: dict[str, Any] = {}
    use_fake_engine(options, DocsSession if attachments else CodeSession)
    window = MainWindow(quick_settings(max_tokens=400), worker_options=options)
    window.resize(width, height)
    window.show()

    def wait_for(signal: SignalInstance) -> None:
        loop = QEventLoop()
        signal.connect(loop.quit)
        QTimer.singleShot(30_000, loop.quit)
        loop.exec()

    if window.model is None:
        wait_for(window.modelChanged)
    if attachments:
        attach_and_ask(window, wait_for)
    else:
        window.input.setPlainText(PROMPT)
        window.send_button.click()
        wait_for(window.replyCompleted)
        window.input.setPlainText("Can it keep the punctuation in place?")
    settle = QEventLoop()
    QTimer.singleShot(600, settle.quit)  # let the last repaint land
    settle.exec()
    if not window.grab().save(str(out)):
        raise SystemExit(f"could not save {out}")
    print(f"{out}: {window.width()}x{window.height()}")
    window.close()


def attach_and_ask(window: MainWindow, wait_for: Callable[[SignalInstance], None]) -> None:
    """Attach a PDF and a Python file as a user would, ask about them, and open the reply's sources."""
    from PySide6.QtWidgets import QApplication

    from app.attachments import ReplySources
    from engine.documents import Citation
    from tests.helpers.documents_fixtures import make_pdf

    folder = Path(tempfile.mkdtemp(prefix="lookahead-chat-docs-"))
    manual = make_pdf(folder / "manual.pdf", MANUAL_PAGES)
    tool = folder / "tool.py"
    tool.write_text(TOOL_PY, encoding="utf-8")
    pane = window.chat_pane
    window.menus.show_lookahead_action.setChecked(True)
    pane.attach_files([str(manual), str(tool)])
    while pane.is_reading_attachments():
        QApplication.processEvents()
    files = pane.pending_attachments()
    window.input.setPlainText(DOCS_PROMPT)
    window.send_button.click()
    wait_for(window.replyCompleted)
    user, reply = pane.chat_view.bubbles()[-2:]
    # What the worker places and the runner shows, when they have not (the fake engine counts no tokens).
    pages = files[0].page_starts
    coverage = {files[0].name: 0.68, files[1].name: 1.0}
    if user.attachment_chips is None:
        user.set_attachments([replace(a, tokens=t) for a, t in zip(files, (412, 38), strict=True)], coverage)
    if reply.sources_section is None:
        text = files[0].text
        reply.set_sources(ReplySources((
            Citation(files[0].name, "page 2", text[pages[1]:pages[2]].strip()),
            Citation(files[1].name, "lines 1–3", files[1].text.strip()),
        ), coverage, whole=False))
    pane.clear_attachments()
    assert reply.sources_section is not None
    pane.context_meter.set_documents(reply.sources_section.sources.coverage)
    reply.sources_section.set_expanded(True)
    reply.sources_section.citation_buttons[0].setChecked(True)
    (folder / "notes.md").write_text("# Notes\n\nAsk about descaling.\n", encoding="utf-8")
    pane.attach_files([str(folder / "notes.md")])  # the next message's file, in the bar above the input
    while pane.is_reading_attachments():
        QApplication.processEvents()
    window.input.setPlainText("And how often should I descale it?")
    pane.chat_view.scroll_to_message(user.message_id or -1, flash=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("WIDTH", "HEIGHT", "SCHEME"), help="make one shot in-process")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--attachments", action="store_true", help="make attachments.png (1366x768, light)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.attachments:
        shoot(1366, 768, "light", args.out / "attachments.png", attachments=True)
        return 0
    if args.one:
        width, height, scheme = int(args.one[0]), int(args.one[1]), args.one[2]
        shoot(width, height, scheme, args.out / f"layout-{width}x{height}-{scheme}.png")
        return 0
    for width, height in SIZES:
        for scheme in SCHEMES:
            cmd = [sys.executable, "-m", "tests.helpers.make_screenshots", "--one", str(width), str(height), scheme,
                   "--out", str(args.out)]
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
