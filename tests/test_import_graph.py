"""engine/ imports form no circle: every import counts, at module level, inside functions or for type checks only.

A circle means no module in it can be read, tested or replaced without the others; the engine's parts are
meant to stack (llama.cpp and model files, then costs and decoding, then the tools). The parent packages a
module's own package path runs first are not counted: they are not an import its author wrote.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"


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
