"""Checks that keep the Markdown docs true to the code: links and their anchors, command lines and their options,
the paths and modules they name, the server's routes and ENGINE.md's table of layers.

Each checker takes a document's text (and the repository's root, or what it checks against) and returns what it
found wrong, one line each; an empty list is a document that holds. tests/project/test_docs.py runs them on
README.md and docs/*.md, and on broken text to show that each one fails.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_INLINE_CODE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")  # one backtick a side; never across a blank line
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # its text may wrap
_REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: ... : not a file of this repository

# Paths and modules the docs name, by the folders and packages at the repository's top.
_PATH = re.compile(r"(?<![\w./~-])((?:engine|app|tests|packaging|resources|docs|\.ci)/[\w./-]*)")
_MODULE = re.compile(r"(?<![\w./-])((?:engine|app|tests)(?:\.[A-Za-z_]\w*)+)")
_PATCH = re.compile(r"(?<![\w./-])(\d\d-[\w.-]+\.patch)")  # a llama.cpp patch, named by itself
PATCHES = Path("packaging", "llama-cpp-patches")


@dataclass(frozen=True)
class Markdown:
    """A Markdown text taken apart: the lines of its fenced code blocks, and the rest (``prose``) with those lines
    left empty, so that a line number still counts from the top."""

    prose: str
    code_lines: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Markdown:
        prose, code = [], []
        fence = ""
        for line in text.splitlines():
            opened = _FENCE.match(line)
            if fence:
                if opened and opened.group(1) == fence:
                    fence = ""
                else:
                    code.append(line)
                prose.append("")
            elif opened:
                fence = opened.group(1)
                prose.append("")
            else:
                prose.append(line)
        return cls("\n".join(prose), tuple(code))

    def inline_code(self) -> list[str]:
        """The text of every inline code span, a line break inside one read as a space (as Markdown does)."""
        return [span.replace("\n", " ") for span in _INLINE_CODE.findall(self.prose)]

    def prose_outside_code(self) -> str:
        """The prose with its inline code spans left out: where a link is a link."""
        return _INLINE_CODE.sub(" ", self.prose)


# -- links and anchors ---------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: its words lower-cased, punctuation other than - and _ dropped,
    each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors as its text
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of ``text``'s headings; a repeated one gets -1, -2, ... in order, as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for line in Markdown.parse(text).prose.splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return found


def broken_links(text: str, source: Path, root: Path) -> list[str]:
    """Relative links and images of ``text`` (the document at ``source``) that reach no file inside ``root``, or
    an anchor that no heading of the Markdown file they reach has."""
    prose = Markdown.parse(text).prose_outside_code()
    problems = []
    for target in _LINK.findall(prose) + _REFERENCE_LINK.findall(prose):
        if _SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (source.parent / path_part).resolve() if path_part else source
        if path_part and (not path.is_relative_to(root.resolve()) or not path.exists()):
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors_of(path, source, text):
            problems.append(f"{target}: no heading with this anchor in {path.name}")
    return problems


def _anchors_of(path: Path, source: Path, source_text: str) -> set[str]:
    return anchors(source_text if path == source else path.read_text(encoding="utf-8"))


# -- command lines -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """A command line a document shows: the module it runs (``engine``, ``app``, ``engine.tools.soak``) and the
    words after it."""

    module: str
    words: tuple[str, ...]

    def __str__(self) -> str:
        return " ".join((self.module, *self.words))


@dataclass
class Programs:
    """This project's command lines: the console scripts (script name to the module it runs) and the argument
    parser of each module run with ``python -m`` (None where the module has none)."""

    scripts: Mapping[str, str]
    parser_for: Callable[[str], argparse.ArgumentParser | None]
    _cache: dict[str, argparse.ArgumentParser | None] = field(default_factory=dict)

    @property
    def packages(self) -> set[str]:
        """The top-level packages whose commands are checked (those the console scripts run)."""
        return {module.split(".")[0] for module in self.scripts.values()}

    def parser(self, module: str) -> argparse.ArgumentParser | None:
        if module not in self._cache:
            self._cache[module] = self.parser_for(module)
        return self._cache[module]

    @classmethod
    def of_project(cls, root: Path) -> Programs:
        """The console scripts ``pyproject.toml`` declares, and the parsers the code itself builds."""
        return cls(console_scripts(root / "pyproject.toml"), entry_parser)


def console_scripts(pyproject: Path) -> dict[str, str]:
    """``[project.scripts]`` of ``pyproject``: each script's name and the module it runs (``app.__main__:main``
    runs ``app``, as ``python -m app`` does)."""
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?:^\[|\Z)", pyproject.read_text(encoding="utf-8"), re.M | re.S)
    entries = re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):\w+"', section.group(1) if section else "", re.M)
    return {name: target.removesuffix(".__main__") for name, target in entries}


class _ParserBuilt(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_built_by(main: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    """The parser ``main(argv)`` builds, caught as it begins to parse, before it does anything with the arguments."""

    def caught(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        raise _ParserBuilt(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", caught):
        try:
            main([])
        except _ParserBuilt as built:
            return built.parser
    raise AssertionError(f"{main.__module__}.main returned without parsing its arguments")


def entry_parser(module: str) -> argparse.ArgumentParser | None:
    """The parser ``python -m module`` reads its arguments with; None where there is no such module or it has no
    ``main``."""
    if module == "engine":
        from engine.tools.cli import build_parser

        return build_parser()  # its main freezes the garbage collector before it parses: not in a test process
    try:
        target = importlib.import_module(module)
        if hasattr(target, "__path__"):  # a package runs its __main__
            target = importlib.import_module(f"{module}.__main__")
    except ModuleNotFoundError:
        return None
    main = getattr(target, "main", None)
    return None if main is None else parser_built_by(main)


def commands(text: str, programs: Programs) -> list[Command]:
    """The command lines of ``programs`` that ``text`` shows in code blocks and inline code: ``python -m MODULE``,
    a console script, and ``engine COMMAND`` at the start of an inline span (the docs' short name for
    ``python -m engine COMMAND``)."""
    doc = Markdown.parse(text)
    scripts = "|".join(re.escape(name) for name in sorted(programs.scripts, key=len, reverse=True))
    start = re.compile(rf"(?:^|(?<=[\s/]))(?:python3? -m (?P<module>[A-Za-z_][\w.]*)|(?P<script>{scripts})(?=\s|$))")
    found = []
    pieces = [_command_part(line) for line in _joined_lines(doc.code_lines)]
    pieces += [re.sub(r"^engine (?=[a-z])", "python -m engine ", span) for span in doc.inline_code()]
    for piece in pieces:
        for match in start.finditer(piece):
            module = match.group("module") or programs.scripts[match.group("script")]
            if module.split(".")[0] in programs.packages and not _placeholder(module):
                found.append(Command(module, tuple(_words(piece[match.end():]))))
    return found


def _joined_lines(lines: Iterable[str]) -> list[str]:
    """Code lines with their ``\\`` continuations joined."""
    joined, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            joined.append(pending + line)
            pending = ""
    return joined + ([pending] if pending else [])


def _command_part(line: str) -> str:
    """A shell line up to its comment; of ``a && b``, both commands, kept apart by a line break."""
    return re.split(r"(?:^|\s)#", line, maxsplit=1)[0].replace("&&", "\n")


def _words(rest: str) -> list[str]:
    """The words of a command's arguments, up to the end of its line; a quoted string is one word."""
    rest = rest.split("\n", 1)[0]
    return re.sub(r"\"[^\"]*\"|'[^']*'", " STRING ", rest).split()


def _flag(word: str) -> str | None:
    """The option a word names (``[--dry`` names ``--dry``, ``--pairs=8`` names ``--pairs``); None for others."""
    option = re.fullmatch(r"(--?[A-Za-z][\w-]*)(?:=.*)?", word.lstrip("[(").rstrip("])|,.;:…"))
    return option.group(1) if option else None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def command_problems(text: str, programs: Programs) -> list[str]:
    """Commands ``text`` shows that the code does not have, and options their parsers do not take.

    A placeholder where a command would be (``COMMAND``, ``...``) is fine, and so is a command named with no
    options; an option is checked against the parser of the command before it."""
    problems = []
    for command in commands(text, programs):
        parser = programs.parser(command.module)
        if parser is None:
            problems.append(f"`{command}`: no command line `python -m {command.module}`")
            continue
        words = list(command.words)
        subcommands = _subcommands(parser)
        if subcommands and words and not words[0].startswith("-"):
            name = words.pop(0)
            if not re.fullmatch(r"[a-z][\w-]*", name):
                continue  # a placeholder: which options follow it cannot be checked
            if name not in subcommands:
                problems.append(f"`{command}`: `{command.module}` has no command {name!r}")
                continue
            parser = subcommands[name]
        problems += [f"`{command}`: {parser.prog} has no option {flag}"
                     for flag in map(_flag, words) if flag is not None and flag not in _options(parser)]
    return problems


def option_list_problems(paragraph: str, parser: argparse.ArgumentParser) -> list[str]:
    """Where a paragraph that lists a command's options (CLI.md's for ``generate``) and the command's parser
    disagree: an option listed that the parser lacks, or one the parser takes that is not listed (either form of an
    on/off option, ``--loop-guard`` or ``--no-loop-guard``, lists it)."""
    listed = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", paragraph))
    problems = [f"{parser.prog} has no option {option}" for option in sorted(listed - _options(parser))]
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction) \
                and listed.isdisjoint(action.option_strings):
            problems.append(f"{parser.prog}: {action.option_strings[0]} is not listed")
    return problems


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the command ``name`` of ``parser`` (``bench`` of ``python -m engine``)."""
    return _subcommands(parser)[name]


# -- paths and modules ---------------------------------------------------------------------------------------


def missing_paths(text: str, root: Path) -> list[str]:
    """Files, folders, modules and llama.cpp patches of the repository that ``text`` names
    (``engine/decoding/plan.py``, ``tests/helpers/``, ``engine.speed.comparison.compare_decoders``,
    ``01-tile-frame.patch``) and ``root`` does not hold."""
    problems = []
    for path in sorted(set(_PATH.findall(text))):
        path = path.rstrip(".")
        if not (root / path).exists():
            problems.append(f"{path}: no such file or folder")
    for name in sorted(set(_MODULE.findall(text))):
        if not _placeholder(name) and not _module_exists(name.rstrip("."), root):
            problems.append(f"{name}: no such module, or no such name in it")
    problems += [f"{name}: no such patch in {PATCHES}" for name in sorted(set(_PATCH.findall(text)))
                 if not (root / PATCHES / name).is_file()]
    return problems


def unnamed_patches(text: str, root: Path) -> list[str]:
    """The patches ``series`` applies that ``text`` (BUILDING.md's table) does not name."""
    series = re.findall(r"^patch (\S+)", (root / PATCHES / "series").read_text(encoding="utf-8"), re.M)
    return [f"{name}: applied, not named" for name in series if name not in _PATCH.findall(text)]


def _placeholder(dotted: str) -> bool:
    """Whether a dotted name stands for any of several (``engine.tools.NAME``)."""
    return any(part.isupper() for part in dotted.split("."))


def _module_exists(name: str, root: Path) -> bool:
    """Whether ``a.b.c`` is a package or module under ``root``, or a name such a module defines or imports."""
    path = root
    parts = name.split(".")
    for i, part in enumerate(parts):
        if (path / part / "__init__.py").is_file():
            path = path / part
        elif (path / f"{part}.py").is_file():
            return i + 1 == len(parts) or parts[i + 1] in _top_level_names(path / f"{part}.py")
        else:
            return (path / "__init__.py").is_file() and part in _top_level_names(path / "__init__.py")
    return True


def _top_level_names(module: Path) -> set[str]:
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


# -- the server's routes and ENGINE.md's layers --------------------------------------------------------------


def missing_routes(text: str, routes: Iterable[str]) -> list[str]:
    """The routes (``"GET /v1/models"``) that ``text`` does not name as ``METHOD path``."""
    return [f"{route}: not named" for route in routes if route not in text]


def layer_table_gaps(text: str, root: Path) -> list[str]:
    """Modules and sub-packages of ``root``'s engine/ that the table of layers in ``text`` (ENGINE.md's) does not
    name: a top-level module in a row's first cell, a package's modules and folders (``commands/``) in the second
    cell of the row whose first cell names the package."""
    top_level: set[str] = set()
    listed: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = line.split("|")
        if not line.startswith("| `engine/") or len(cells) < 4:
            continue
        top_level.update(re.findall(r"`(?:engine/)?(\w+)\.py`", cells[1]))
        for package in re.findall(r"`engine/(\w+)/`", cells[1]):
            listed.setdefault(package, set()).update(re.findall(r"`(\w+/?)`", cells[2]))
    engine = root / "engine"
    problems = [f"engine/{module.name}: not in the table"
                for module in sorted(engine.glob("*.py"))
                if not module.name.startswith("__") and module.stem not in top_level]
    for package in sorted(p for p in engine.iterdir() if (p / "__init__.py").is_file()):
        names = listed.get(package.name)
        if names is None:
            problems.append(f"engine/{package.name}/: no row")
            continue
        problems += [f"engine/{package.name}/{part}: not in its row" for part in _parts(package) if part not in names]
    return problems


def _parts(package: Path) -> list[str]:
    """A package's modules (``plan``) and sub-packages (``commands/``), as the table names them."""
    modules = [p.stem for p in sorted(package.glob("*.py")) if not p.name.startswith("__")]
    folders = [f"{p.name}/" for p in sorted(package.iterdir()) if (p / "__init__.py").is_file()]
    return modules + folders
