"""README.md and docs/*.md say what the code does: their links reach files and headings, the commands they show
exist with the options they show, the paths, modules and patches they name exist; CLI.md lists every option of
``generate``, BUILDING.md every patch the build applies, SERVER.md every route the server has, and ENGINE.md's
table of layers every module. Each check is also shown failing on text broken on purpose (the checks are in
tests/helpers/doc_checks.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.server.api import ModelServer
from engine.server.config import ServerConfig
from engine.server.jobs import Job
from tests.helpers.doc_checks import (
    PATCHES,
    Programs,
    anchors,
    broken_links,
    command_problems,
    commands,
    layer_table_gaps,
    missing_paths,
    missing_routes,
    option_list_problems,
    subcommand_parser,
    unnamed_patches,
)
from tests.helpers.optional import present

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = Programs.of_project(ROOT)


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class _NoJobs:
    def submit(self, job: Job) -> None:
        raise AssertionError("the route table is read without serving")


def _generate_options_paragraph() -> str:
    """CLI.md's paragraph that lists ``generate``'s options."""
    text = _read(ROOT / "docs" / "CLI.md")
    return text[text.index("`generate` options:"):].split("\n\n")[0]


def _server_routes() -> list[str]:
    app = ModelServer(_NoJobs(), "model", ServerConfig(port=0))._make_app()
    return sorted({f"{route.method} {route.resource.canonical}" for route in app.router.routes()
                   if route.method != "HEAD" and route.resource is not None})


# -- the real docs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_relative_link_reaches_a_file_and_every_anchor_a_heading(doc):
    assert broken_links(_read(doc), doc, ROOT) == []


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_command_shown_exists_with_the_options_shown(doc):
    assert command_problems(_read(doc), PROGRAMS) == []


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_file_folder_and_module_named_exists(doc):
    assert missing_paths(_read(doc), ROOT) == []


def test_the_docs_show_commands_of_the_engine_the_app_and_the_engine_s_tools():
    shown = {command.module for doc in DOCS for command in commands(_read(doc), PROGRAMS)}
    assert {"engine", "app", "engine.tools.soak", "engine.tools.loopcheck"} <= shown


def test_cli_md_lists_every_option_of_generate_and_no_other():
    generate = subcommand_parser(present(PROGRAMS.parser("engine")), "generate")
    assert option_list_problems(_generate_options_paragraph(), generate) == []


def test_building_md_names_every_patch_the_build_applies():
    assert unnamed_patches(_read(ROOT / "docs" / "BUILDING.md"), ROOT) == []


def test_server_md_names_every_route_the_server_has():
    routes = _server_routes()
    assert "GET /v1/models/{model}" in routes and "POST /v1/messages" in routes
    assert missing_routes(_read(ROOT / "docs" / "SERVER.md"), routes) == []


def test_engine_md_s_table_of_layers_names_every_module_and_folder_of_the_engine():
    assert layer_table_gaps(_read(ROOT / "docs" / "ENGINE.md"), ROOT) == []


# -- each check fails on broken text -------------------------------------------------------------------------


def test_a_heading_s_anchor_follows_github_s_rules():
    text = "# Speed\n## Threads, and other programs on the same PC\n## Choosing W, N, G (manual mode)\n" \
           "## `engine bench` --json\n## Speed\n## Speed\n```\n# not a heading\n```\n"
    assert anchors(text) == {"speed", "threads-and-other-programs-on-the-same-pc", "choosing-w-n-g-manual-mode",
                             "engine-bench---json", "speed-1", "speed-2"}


def test_a_link_to_a_missing_file_or_heading_is_reported_and_one_in_code_is_not():
    doc = ROOT / "docs" / "NEW.md"
    text = ("# Here\n[ok](SPEED.md#the-loop-guard) [ok](#here) [ok](../README.md) [web](https://example.com)\n"
            "[gone](GONE.md) [moved to\nSPEED](SPEED.md#hybrid-models-in-numbers) [self](#there)\n"
            "![shot](../resources/x.png)\n"
            "`[code](NOT-CHECKED.md)`\n```\n[code](NOT-CHECKED.md)\n```\n")
    assert broken_links(text, doc, ROOT) == [
        "GONE.md: no such file",
        "SPEED.md#hybrid-models-in-numbers: no heading with this anchor in SPEED.md",
        "#there: no heading with this anchor in NEW.md",
        "../resources/x.png: no such file",
    ]


def test_a_command_with_an_option_its_parser_lacks_or_a_command_the_code_lacks_is_reported():
    text = ("```bash\n.venv/bin/python -m engine bench --max-tokens 128 --pairs 8   # --not-checked\n"
            "python -m engine bench --threads 2 \\\n  --max-token 64\n```\n"
            "`engine tune --save FILE`, `python -m engine render --model F`, `lookahead-chat --self-tst`,\n"
            "`python -m engine.tools.loopcheck [--prompts F] [--dry 0 |\n--repeat-penalty 1.1]`, "
            "`python -m engine.tools.soaking --generations 2`, `python -m engine COMMAND --anything`\n")
    assert command_problems(text, PROGRAMS) == [
        "`engine bench --threads 2 --max-token 64`: python -m engine bench has no option --max-token",
        "`engine render --model F`: `engine` has no command 'render'",
        "`app --self-tst`: lookahead-chat has no option --self-tst",
        "`engine.tools.soaking --generations 2`: no command line `python -m engine.tools.soaking`",
    ]


def test_an_option_removed_from_the_code_is_reported_where_the_docs_still_show_it():
    def without_pairs(module: str) -> argparse.ArgumentParser | None:
        parser = argparse.ArgumentParser(prog="python -m engine")
        bench = parser.add_subparsers(dest="command").add_parser("bench", prog="python -m engine bench")
        bench.add_argument("--max-tokens")
        return parser if module == "engine" else None

    text = "`python -m engine bench --max-tokens 128 --pairs 8`"
    assert command_problems(text, PROGRAMS) == []
    assert command_problems(text, Programs({"lookahead-engine": "engine"}, without_pairs)) == [
        "`engine bench --max-tokens 128 --pairs 8`: python -m engine bench has no option --pairs"]


def test_a_renamed_module_or_file_is_reported_where_the_docs_still_name_it():
    text = ("The plan is in `engine/decoding/plan.py`, measured by `engine.speed.comparison.compare_decoders`, "
            "tested in tests/engine/<package>/ and built by packaging/build-linux.sh.\n"
            "Old names: engine/decoding/plans.py, `engine.decoding.planner`, engine.speed.comparison.compare, "
            "app/widgets/charts/ and `tests.helpers.fakes`.\n")
    assert missing_paths(text, ROOT) == [
        "app/widgets/charts/: no such file or folder",
        "engine/decoding/plans.py: no such file or folder",
        "engine.decoding.planner: no such module, or no such name in it",
        "engine.speed.comparison.compare: no such module, or no such name in it",
        "tests.helpers.fakes: no such module, or no such name in it",
    ]


def test_an_option_list_that_lacks_an_option_or_names_one_gone_is_reported():
    parser = argparse.ArgumentParser(prog="python -m engine generate")
    parser.add_argument("--prompt")
    parser.add_argument("--attach", action="append")
    parser.add_argument("--loop-guard", action=argparse.BooleanOptionalAction)
    listed = "`generate` options: `--prompt TEXT`, `--attach-file FILE` (repeatable), `--no-loop-guard`."
    assert option_list_problems(listed, parser) == ["python -m engine generate has no option --attach-file",
                                                    "python -m engine generate: --attach is not listed"]


def test_a_patch_the_build_applies_that_the_docs_leave_out_or_one_gone_is_reported(tmp_path):
    (tmp_path / PATCHES).mkdir(parents=True)
    (tmp_path / PATCHES / "series").write_text("# parts\npatch 01-frame.patch\npatch 02-tiles.patch\n")
    for name in ("01-frame.patch", "02-tiles.patch"):
        (tmp_path / PATCHES / name).touch()
    text = "| `01-frame.patch` | the frame |\n| `02-q4_1-tile.patch` | a tile |\n"
    assert unnamed_patches(text, tmp_path) == ["02-tiles.patch: applied, not named"]
    assert missing_paths(text, tmp_path) == [f"02-q4_1-tile.patch: no such patch in {PATCHES}"]


def test_a_route_the_docs_do_not_name_is_reported():
    text = "Endpoints: `GET /v1/models`, `POST /v1/chat/completions`."
    assert missing_routes(text, ["GET /v1/models", "GET /v1/models/{model}", "POST /v1/chat/completions"]) == [
        "GET /v1/models/{model}: not named"]


def test_a_module_the_table_of_layers_leaves_out_is_reported(tmp_path):
    for path in ("files.py", "units.py", "decoding/__init__.py", "decoding/plan.py", "decoding/pool.py",
                 "server/__init__.py", "tools/__init__.py", "tools/cli.py", "tools/commands/__init__.py"):
        (tmp_path / "engine" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "engine" / path).touch()
    table = ("| layer | what it holds |\n|---|---|\n| `engine/files.py` | the app's folders |\n"
             "| `engine/decoding/` | `plan` (the batch layout) |\n| `engine/tools/` | `cli`, `cmds/` |\n")
    assert layer_table_gaps(table, tmp_path) == ["engine/units.py: not in the table",
                                                 "engine/decoding/pool: not in its row",
                                                 "engine/server/: no row",
                                                 "engine/tools/commands/: not in its row"]
