"""Makes the layout screenshots in ``resources/screenshots/`` (not a test: pytest does not collect this file).

Run under a display (e.g. ``Xvfb :99 -screen 0 1600x1000x24 & DISPLAY=:99 python -m tests.make_screenshots``).
Each shot is the real window with a fake engine (``tests.app_fixtures.FakeEngine``) whose reply holds a code
block, at a laptop size, in the light and the dark colour scheme. Every shot runs in its own process: the
colour scheme is read when the widgets are made.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PySide6.QtGui import QPalette

SIZES = ((1024, 700), (1366, 768))
SCHEMES = ("light", "dark")
OUT_DIR = Path(__file__).resolve().parent.parent / "resources" / "screenshots"
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

    def reply(self, messages, controls, sampling=None, stop=None, drafts_from=()):  # noqa: ANN001 (a fake)
        from engine import StepEvent

        pieces = [REPLY[i:i + 4] for i in range(0, len(REPLY), 4)]

        def events():
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


def shoot(width: int, height: int, scheme: str, out: Path) -> None:
    """One screenshot: the window at ``width``×``height`` after one reply, in ``scheme``."""
    os.environ["LOOKAHEAD_CHAT_HOME"] = tempfile.mkdtemp(prefix="lookahead-chat-shots-")
    from PySide6.QtCore import QEventLoop, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from app.__main__ import prepare_application
    from app.main_window import MainWindow
    from app.widgets.markdown_view import palette_is_dark
    from tests.app_fixtures import quick_settings, use_fake_engine

    app = QApplication(sys.argv[:1])
    if scheme == "dark":
        app.styleHints().setColorScheme(Qt.ColorScheme.Dark)
        if not palette_is_dark():  # a platform without a dark theme of its own (e.g. a bare X server)
            app.setStyle("Fusion")
            app.setPalette(dark_palette())
    prepare_application(app)
    if palette_is_dark() != (scheme == "dark"):
        raise SystemExit(f"the {scheme} colour scheme did not take on this platform")

    options: dict = {}
    use_fake_engine(options, CodeSession)
    window = MainWindow(quick_settings(max_tokens=400), worker_options=options)
    window.resize(width, height)
    window.show()

    def wait_for(signal) -> None:  # noqa: ANN001
        loop = QEventLoop()
        signal.connect(loop.quit)
        QTimer.singleShot(30_000, loop.quit)
        loop.exec()

    if window.model is None:
        wait_for(window.modelChanged)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("WIDTH", "HEIGHT", "SCHEME"), help="make one shot in-process")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        width, height, scheme = int(args.one[0]), int(args.one[1]), args.one[2]
        shoot(width, height, scheme, args.out / f"layout-{width}x{height}-{scheme}.png")
        return 0
    for width, height in SIZES:
        for scheme in SCHEMES:
            cmd = [sys.executable, "-m", "tests.make_screenshots", "--one", str(width), str(height), scheme,
                   "--out", str(args.out)]
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
