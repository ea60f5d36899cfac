"""No app/ module reaches into another's private names: each object's underscored attributes are its own.

A name with a leading underscore is its owner's business: it may change without a caller knowing. So outside
``self`` and ``cls`` no ``obj._name`` is read or called (``window._on_send_shortcut`` from the menus module was
one), and no ``from module import _name`` takes one. Dunder names (``__version__``, ``__name__``) are public by
Python's own rule and pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
OWN = ("self", "cls")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """Each reach into another's private name in ``source``, as "line: what", in the file's order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in OWN):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [(node.lineno, f"from {module} import {a.name}") for a in node.names if _private(a.name)]
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_no_app_module_uses_another_objects_private_names() -> None:
    files = sorted(APP.rglob("*.py"))
    assert len(files) > 20, "the walk found the app's modules"
    found = [f"{path.relative_to(APP.parent)}:{use}" for path in files
             for use in private_uses(path.read_text(encoding="utf-8"))]
    assert found == []


def test_a_private_slot_called_from_the_menus_is_found() -> None:
    source = (
        "from PySide6 import __version__\n"
        "from .records import _COLUMNS, Conversation\n"
        "\n"
        "def build_menu_bar(window, do):\n"
        "    window.send_action.triggered.connect(window._on_send_shortcut)\n"
        "    window.parts._model.reload()\n"
        "    do.send()\n"
        "\n"
        "class Menus:\n"
        "    def __init__(self):\n"
        "        self._built = True\n"
        "        print(self.__class__.__name__)\n"
        "\n"
        "    @classmethod\n"
        "    def make(cls):\n"
        "        return cls._made\n"
    )
    assert private_uses(source) == [
        "2: from .records import _COLUMNS",
        "5: window._on_send_shortcut",
        "6: window.parts._model",
    ]
