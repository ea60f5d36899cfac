"""``engine/`` and the app's Qt-free modules must not import Qt: the layering the app is built on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The app's modules that hold logic without widgets: testable, and usable, without Qt.
QT_FREE_APP_MODULES = ("app.stats", "app.comparison_jobs")

# Imports engine and every module of it, then the modules named on the command line, with Qt blocked.
BLOCK_QT_AND_IMPORT_ENGINE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    class BlockQt:
        BLOCKED = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "shiboken2", "qtpy")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.BLOCKED:
                raise ImportError(f"imported Qt: {name}")
            return None

    sys.meta_path.insert(0, BlockQt())
    import engine
    for mod in pkgutil.walk_packages(engine.__path__, "engine."):
        importlib.import_module(mod.name)
    for name in sys.argv[1:]:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BlockQt.BLOCKED)
    assert not leaked, leaked
    print("ok", len([m for m in sys.modules if m.startswith("engine")]))
    """
)


def _import_with_qt_blocked(*modules: str, script: str = BLOCK_QT_AND_IMPORT_ENGINE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *modules],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_engine_and_all_its_modules_import_with_qt_blocked():
    result = _import_with_qt_blocked()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_apps_qt_free_modules_import_with_qt_blocked():
    result = _import_with_qt_blocked(*QT_FREE_APP_MODULES)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_blocker_would_catch_a_qt_import():
    # The checks above are only worth something if importing Qt under the blocker fails.
    script = BLOCK_QT_AND_IMPORT_ENGINE.replace("import engine\n", "import engine\nimport PySide6.QtCore\n", 1)
    result = _import_with_qt_blocked(script=script)
    assert result.returncode != 0
    assert "imported Qt: PySide6" in result.stderr


def test_the_blocker_would_catch_an_app_module_that_imports_qt():
    result = _import_with_qt_blocked("app.widgets.stats_view")
    assert result.returncode != 0
    assert "imported Qt: PySide6" in result.stderr
