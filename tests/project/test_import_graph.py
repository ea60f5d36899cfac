"""engine/ imports go one way, down its layers, and form no circle; app/ forms no circle either and never imports
the engine's tools.

Every import counts, at module level, inside functions or for type checks only. The layers, lowest first:

    engine.files, engine.units, engine.documents   files, units and document text
    engine.llama                                   llama.cpp, model files, the test load's parent side
    engine.costs, engine.library                   what steps cost on this PC; models other apps keep
    engine.decoding                                plain and lookahead decoding, chat turns
    engine.speed                                   measuring runs against each other, workloads
    engine.server                                  the OpenAI-compatible server
    engine.tools                                   the command line, benches, model shapes
    engine (its __init__ and __main__)             the package's face

A module may import its own layer and those below, never one above: each layer can be read, tested and
replaced without those above it. A circle means no module in it can be read without the others (in app/, too:
a window that hands itself to a helper module, which imports the window's class to type it, is one). The parent
packages a module's own package path runs first are not counted: they are not an import its author wrote.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
APP = ENGINE.parent / "app"


def module_name(path: Path, root: Path = ENGINE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str], root: Path = ENGINE) -> set[str]:
    """The engine modules ``path`` imports, wherever in the file the import statement is."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from package import module`` imports the module; ``from module import name`` the module itself.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph(root: Path = ENGINE) -> dict[str, set[str]]:
    files = sorted(root.rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    return {module_name(f, root): imports_of(f, modules, root) for f in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


LAYERS: tuple[tuple[str, ...], ...] = (
    ("engine.files", "engine.units", "engine.documents"),
    ("engine.llama",),
    ("engine.costs", "engine.library"),
    ("engine.decoding",),
    ("engine.speed",),
    ("engine.server",),
    ("engine.tools",),
    ("engine", "engine.__main__"),
)
NOT_CODE = ("engine.data",)  # documents the workloads attach (some are Python files), never imported


def layer_of(module: str) -> int:
    """The layer ``module`` is in: the one naming its package (``engine.costs.curve`` -> engine.costs)."""
    top = ".".join(module.split(".")[:2])
    for i, names in enumerate(LAYERS):
        if top in names or module in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def imports_against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a layer above its own, as "importer -> imported"."""
    return [f"{m} -> {d}" for m, deps in sorted(graph.items()) if not m.startswith(NOT_CODE)
            for d in sorted(deps) if layer_of(d) > layer_of(m)]


def test_engine_imports_go_down_its_layers() -> None:
    graph = import_graph()
    assert imports_against_the_layers(graph) == []


def test_an_import_from_a_layer_above_is_found(tmp_path: Path) -> None:
    """The check fails on an import against the order, at module level or inside a function."""
    pkg = tmp_path / "engine"
    for sub in ("llama", "decoding", "tools"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "decoding" / "settings.py").write_text("MAX = 1\n")
    (pkg / "llama" / "native.py").write_text("from engine.decoding.settings import MAX\n")
    (pkg / "llama" / "probe.py").write_text("def child():\n    from engine.tools import cli\n")
    (pkg / "tools" / "cli.py").write_text("from engine.llama import native\n")
    assert imports_against_the_layers(import_graph(pkg)) == [
        "engine.llama.native -> engine.decoding.settings", "engine.llama.probe -> engine.tools.cli"]


def test_the_app_never_imports_the_engines_tools() -> None:
    """The app stands on the engine's library, not on its command line or benches (engine.tools)."""
    found = []
    for path in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(APP.parent)}: {n}" for n in names if n.startswith("engine.tools")]
    assert found == []


def test_the_engine_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 20, "the walk found the engine's modules"
    assert circles(graph) == []


def test_a_circle_through_a_type_check_only_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "engine"
    (pkg / "costs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "costs" / "__init__.py").write_text("")
    (pkg / "runtime.py").write_text("from .costs import curve\n")
    (pkg / "costs" / "curve.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..runtime import Engine\n")
    (pkg / "alone.py").write_text("def f():\n    from engine.costs.curve import x\n")
    assert circles(import_graph(pkg)) == [["engine.costs.curve", "engine.runtime"]]


def test_the_app_has_no_import_circle() -> None:
    """Every import of app/ counts, those for type checks only too."""
    graph = import_graph(APP)
    assert len(graph) > 20, "the walk found the app's modules"
    assert circles(graph) == []


def test_a_window_typed_by_the_module_it_hands_itself_to_is_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main_window.py").write_text("from . import menus\n\nclass MainWindow:\n    pass\n")
    (pkg / "menus.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .main_window import MainWindow\n")
    assert circles(import_graph(pkg)) == [["app.main_window", "app.menus"]]
