"""A test that reads a clock carries the ``timing`` marker, so ``-m "not timing"`` leaves out every test whose outcome
can hang on how fast or how loaded the machine is.

Read with ``ast``, over every module of tests/: a test reads a clock when its body, a fixture it takes (of its own
module, a conftest.py above it or a plugin those list, an autouse one too) or a function or class of tests/ it names
reads one of ``CLOCKS``, at any depth. What no parser can see, a bound on a duration the app measured itself or a
short wait that must succeed, the marker's description in pyproject.toml asks for by hand.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MARKER = "pytest.mark.timing"
_TIMERS = ("time", "monotonic", "perf_counter", "process_time", "thread_time")
CLOCKS = frozenset(
    {f"time.{timer}{ns}" for timer in _TIMERS for ns in ("", "_ns")}
    | {"datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today"}
    | {f"PySide6.QtCore.{clock}" for clock in ("QElapsedTimer", "QDateTime.currentDateTime",
                                                "QDateTime.currentMSecsSinceEpoch", "QTime.currentTime")}
)

Function = ast.FunctionDef | ast.AsyncFunctionDef


def module_name(path: Path, root: Path = TESTS) -> str:
    """``tests/app/test_log.py`` → ``tests.app.test_log``."""
    return ".".join(path.relative_to(root.parent).with_suffix("").parts)


@dataclass
class Module:
    """One module's source as the check reads it: its imports by local name and its top-level definitions."""

    name: str
    tree: ast.Module
    imported: dict[str, str] = field(default_factory=dict)  # local name -> the dotted name it stands for
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions and classes

    @classmethod
    def parse(cls, name: str, source: str) -> Module:
        module = cls(name, ast.parse(source))
        for node in ast.walk(module.tree):  # imports inside functions count too (``import time`` in a test)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.partition(".")[0]
                    module.imported[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    module.imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.defs[node.name] = node
        return module

    def dotted(self, node: ast.AST) -> str | None:
        """What a name or an attribute chain stands for: ``time.monotonic``, ``datetime.datetime.now``, …"""
        if isinstance(node, ast.Name):
            return self.imported.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def fixtures(self) -> dict[str, Function]:
        return {name: node for name, node in self.defs.items()
                if isinstance(node, Function) and any(_is_fixture(d) for d in node.decorator_list)}

    def autouse(self) -> list[str]:
        return [name for name, node in self.fixtures().items()
                if any(isinstance(d, ast.Call) and _is_fixture(d) and _keyword_true(d, "autouse")
                       for d in node.decorator_list)]

    def assigned(self, name: str) -> ast.expr | None:
        """The value a module-level ``name = ...`` gives it."""
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node.value
        return None

    def marks(self) -> set[str]:
        """The marks ``pytestmark`` gives the whole module."""
        value = self.assigned("pytestmark")
        values = value.elts if isinstance(value, ast.List | ast.Tuple) else [value] if value is not None else []
        return {m for m in map(self.mark_of, values) if m}

    def mark_of(self, decorator: ast.expr) -> str | None:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = self.dotted(target)
        return name if name is not None and name.startswith("pytest.mark.") else None

    def plugins(self) -> list[str]:
        """The modules a conftest.py loads as plugins (``pytest_plugins``)."""
        value = self.assigned("pytest_plugins")
        nodes = ast.walk(value) if value is not None else ()
        return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture" or (
        isinstance(target, ast.Name) and target.id == "fixture")


def _keyword_true(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)


Key = tuple[str, str]  # (module, top-level name)


class ClockReaders:
    """Which definitions of a set of modules read a clock, themselves or through what they use."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.modules = {name: Module.parse(name, source) for name, source in sources.items()}
        self._known: dict[Key, str | None] = {}

    def unmarked(self) -> list[str]:
        """``module::test — how it reads the clock`` for every test that reads one without the marker."""
        found = []
        for module in self.modules.values():
            if not module.name.rpartition(".")[2].startswith("test_") or MARKER in module.marks():
                continue
            for name, node in module.defs.items():
                if not (name.startswith("test") and isinstance(node, Function)):
                    continue
                if MARKER in {module.mark_of(d) for d in node.decorator_list}:
                    continue
                how = self._reads(module, node, ())
                if how is not None:
                    found.append(f"{module.name}::{name} — {how}")
        return sorted(found)

    def _reads(self, module: Module, node: ast.AST, path: tuple[Key, ...]) -> str | None:
        """How ``node`` (a function or class of ``module``) reads a clock, or None."""
        for inner in ast.walk(node):
            name = module.dotted(inner) if isinstance(getattr(inner, "ctx", None), ast.Load) else None
            if name in CLOCKS:
                return name
        for key in self._uses(module, node):
            how = self._reads_def(key, path)
            if how is not None:
                return f"{key[1]} → {how}"
        return None

    def _reads_def(self, key: Key, path: tuple[Key, ...]) -> str | None:
        if key in path:  # a circle of uses: the first visit answers for it
            return None
        if key not in self._known:
            module = self.modules[key[0]]
            self._known[key] = self._reads(module, module.defs[key[1]], (*path, key))
        return self._known[key]

    def _uses(self, module: Module, node: ast.AST) -> Iterator[Key]:
        """The definitions of tests/ that ``node`` names, and the fixtures it takes (autouse ones too)."""
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in module.defs and inner.id not in module.imported:
                yield module.name, inner.id
            elif isinstance(inner, ast.Name | ast.Attribute) and isinstance(inner.ctx, ast.Load):
                owner, _, name = (module.dotted(inner) or "").rpartition(".")
                if owner in self.modules and name in self.modules[owner].defs:
                    yield owner, name
        if isinstance(node, Function):
            fixtures = self._fixtures_seen_from(module)
            taken = [a.arg for a in node.args.args + node.args.kwonlyargs]
            for name in [*taken, *self._autouse_seen_from(module)]:
                if name in fixtures:
                    yield fixtures[name]

    def _scopes(self, module: Module) -> list[Module]:
        """Where a fixture that ``module`` takes may be: itself, the conftest.py files above it, their plugins."""
        parts = module.name.split(".")
        conftests = [f"{'.'.join(parts[:i])}.conftest" for i in range(len(parts) - 1, 0, -1)]
        found = [self.modules[c] for c in conftests if c in self.modules]
        plugins = [self.modules[p] for c in found for p in c.plugins() if p in self.modules]
        return [module, *found, *plugins]

    def _fixtures_seen_from(self, module: Module) -> dict[str, Key]:
        seen: dict[str, Key] = {}
        for scope in reversed(self._scopes(module)):  # the nearest definition wins, as in pytest
            seen.update({name: (scope.name, name) for name in scope.fixtures()})
        return seen

    def _autouse_seen_from(self, module: Module) -> list[str]:
        return [name for scope in self._scopes(module) for name in scope.autouse()]


def sources_of_tests(root: Path = TESTS) -> dict[str, str]:
    return {module_name(p, root): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}


def test_every_test_that_reads_a_clock_is_marked_timing():
    unmarked = ClockReaders(sources_of_tests()).unmarked()
    assert unmarked == [], "add @pytest.mark.timing (see its description in pyproject.toml):\n" + "\n".join(unmarked)


SYNTHETIC = '''
import time
from datetime import datetime

import pytest

from tests.helpers.clock import stopwatch


def elapsed(start):
    return time.monotonic() - start


@pytest.fixture
def started():
    return datetime.now()


@pytest.fixture(autouse=True)
def quiet():
    yield


def test_direct():
    t0 = time.perf_counter()
    assert time.perf_counter() - t0 < 1


def test_through_a_helper():
    assert elapsed(0.0) > 0


def test_through_a_fixture(started):
    assert started


def test_through_another_module():
    with stopwatch():
        pass


def test_by_an_import_inside_the_test():
    from time import process_time
    assert process_time() >= 0


@pytest.mark.timing
def test_marked():
    assert time.monotonic() > 0


def test_without_a_clock(tmp_path):
    time.sleep(0)
    assert tmp_path
'''

CLOCK_HELPER = '''
import contextlib
import time


@contextlib.contextmanager
def stopwatch():
    t0 = time.thread_time()
    yield
    assert time.thread_time() >= t0
'''


def test_the_check_finds_each_way_of_reading_a_clock_and_spares_a_marked_test():
    unmarked = ClockReaders({"tests.fake.test_clocks": SYNTHETIC, "tests.helpers.clock": CLOCK_HELPER}).unmarked()
    assert unmarked == [
        "tests.fake.test_clocks::test_by_an_import_inside_the_test — time.process_time",
        "tests.fake.test_clocks::test_direct — time.perf_counter",
        "tests.fake.test_clocks::test_through_a_fixture — started → datetime.datetime.now",
        "tests.fake.test_clocks::test_through_a_helper — elapsed → time.monotonic",
        "tests.fake.test_clocks::test_through_another_module — stopwatch → time.thread_time",
    ]


def test_a_module_marked_timing_as_a_whole_needs_no_mark_on_its_tests():
    source = SYNTHETIC.replace("import pytest\n", "import pytest\n\npytestmark = [pytest.mark.timing]\n", 1)
    assert ClockReaders({"tests.fake.test_clocks": source, "tests.helpers.clock": CLOCK_HELPER}).unmarked() == []


def test_an_autouse_fixture_of_a_conftest_that_reads_a_clock_reaches_every_test_below_it():
    conftest = "import time\nimport pytest\n\n@pytest.fixture(autouse=True)\ndef clocked():\n    yield time.time()\n"
    test = "def test_plain():\n    assert True\n"
    readers = ClockReaders({"tests.fake.conftest": conftest, "tests.fake.test_plain": test})
    assert readers.unmarked() == ["tests.fake.test_plain::test_plain — clocked → time.time"]
