"""The first window fits the screen it opens on: a laptop's 1366×768 or 1024×700 as well as a large one.

Each case runs the app's window in its own process on Qt's offscreen platform given a screen of that size (its
``configfile`` option), with a fresh home: a window already open cannot show what a new one does on a small screen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, QSize

from app.window_geometry import DEFAULT_SIZE, FRAME_ALLOWANCE, fit_to_screen

REPO = Path(__file__).resolve().parents[2]

# Opens a MainWindow (no model) on the configured screen, optionally resizes it and closes it (which saves its
# geometry), and prints where the window and the parts a person must reach lie.
SCRIPT = r"""
import json, sys
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.main_window import MainWindow
resize_to = json.loads(sys.argv[1])
window = MainWindow(load_model=False)
window.show()
app.processEvents()
if resize_to:
    window.resize(*resize_to)
    app.processEvents()

def rect(w):
    top_left = w.mapToGlobal(w.rect().topLeft())
    return [top_left.x(), top_left.y(), w.width(), w.height()]

window.tabs.setCurrentWidget(window.compare_view)
app.processEvents()
compare = {"verdict": rect(window.compare_view.verdict), "compare": rect(window.compare_view.compare_button)}
window.tabs.setCurrentWidget(window.chat_pane)
app.processEvents()
g = window.geometry()
screen = app.primaryScreen().availableGeometry()
print(json.dumps({
    "window": [g.x(), g.y(), g.width(), g.height()],
    "screen": [screen.x(), screen.y(), screen.width(), screen.height()],
    "input": rect(window.chat_pane.input), "send": rect(window.chat_pane.send_button), **compare,
}))
window.close()
"""


def _open(tmp_path: Path, home: Path, screen: tuple[int, int], resize_to: tuple[int, int] | None = None) -> dict:
    config = tmp_path / f"screen-{screen[0]}x{screen[1]}.json"
    config.write_text(json.dumps({"screens": [{
        "name": "screen", "x": 0, "y": 0, "width": screen[0], "height": screen[1],
        "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1,
    }]}))
    env = dict(os.environ, QT_QPA_PLATFORM=f"offscreen:configfile={config}", LOOKAHEAD_CHAT_HOME=str(home),
               PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(resize_to)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _inside(part: list[int], screen: list[int]) -> bool:
    x, y, w, h = part
    sx, sy, sw, sh = screen
    return sx <= x and sy <= y and x + w <= sx + sw and y + h <= sy + sh


@pytest.mark.parametrize("screen", [(1024, 700), (1366, 768), (2560, 1440)])
def test_a_first_window_lies_within_the_screen_with_send_and_compare_in_reach(tmp_path, screen):
    shown = _open(tmp_path, tmp_path / "home", screen)
    room = QRect(*shown["screen"]).marginsRemoved(FRAME_ALLOWANCE)
    window = QRect(*shown["window"])
    assert room.contains(window), f"{shown['window']} is not within {shown['screen']} with its frame"
    if room.width() >= DEFAULT_SIZE.width() and room.height() >= DEFAULT_SIZE.height():
        assert window.size() == DEFAULT_SIZE and window.center() == room.center()  # a big screen: the usual size
    for part in ("input", "send", "verdict", "compare"):
        assert _inside(shown[part], shown["screen"]), f"{part} at {shown[part]} lies outside {shown['screen']}"


def test_a_size_kept_from_a_bigger_screen_is_made_to_fit_a_smaller_one(tmp_path):
    home = tmp_path / "home"
    big = _open(tmp_path, home, (2560, 1440), resize_to=(2000, 1200))
    assert big["window"][2:] == [2000, 1200]
    small = _open(tmp_path, home, (1366, 768))  # the same settings, on a laptop's screen
    room = QRect(*small["screen"]).marginsRemoved(FRAME_ALLOWANCE)
    assert room.contains(QRect(*small["window"])), small
    assert _inside(small["send"], small["screen"]) and _inside(small["verdict"], small["screen"])


def test_fitting_keeps_a_window_that_fits_where_it_is_and_moves_one_that_does_not_only_as_far_as_it_must():
    available, minimum = QRect(0, 0, 1920, 1080), QSize(900, 600)
    kept = QRect(300, 200, 1000, 700)
    assert fit_to_screen(kept, available, minimum, centre=False) == kept
    off_right = fit_to_screen(QRect(1500, 200, 1000, 700), available, minimum, centre=False)
    assert off_right == QRect(1920 - FRAME_ALLOWANCE.right() - 1000, 200, 1000, 700)
    assert fit_to_screen(QRect(0, 0, 400, 300), available, minimum, centre=False).size() == minimum
