"""Each fact has one home: the folders, how a JSON file is written, sizes, FTS5 strings, the export notice and
what a model-file problem is called. A second definition shows up here before it can tell users two things."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.files import cache_root, write_json_atomic
from engine.llama.problems import KIND_TOO_SLOW, ModelFileError, plain_message

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "engine").rglob("*.py")) + sorted((ROOT / "app").rglob("*.py"))


def _files_with(pattern: str) -> list[str]:
    regex = re.compile(pattern)
    return sorted(str(p.relative_to(ROOT)) for p in SOURCES if regex.search(p.read_text(encoding="utf-8")))


@pytest.mark.parametrize(("pattern", "home"), [
    (r'"LOOKAHEAD_CHAT_HOME"', ["engine/files.py"]),  # where the files live
    (r"user_cache_dir\(", ["engine/files.py"]),
    (r"\.tmp\b", ["engine/files.py"]),  # a file written whole or not at all
    (r"def \w*size\w*\(n(_bytes)?: int\)", ["engine/units.py"]),  # a size as people read it
    (r"""f'"\{w\}"'""", ["engine/documents.py"]),  # a word as an FTS5 string
    (r'"Export failed"', ["app/widgets/plain.py"]),
    (r'replace\("&", "&amp;"\)', []),  # html.escape, not by hand
    (r"speedup \(range\)", ["engine/speed/tables.py"]),  # the speed tables' columns
    (r"\.extra\b", []),  # a speed row's figures are typed fields (engine/speed/rows.py), not a dict's keys
])
def test_a_fact_is_defined_in_one_place(pattern, home):
    assert _files_with(pattern) == home


def test_a_json_file_is_replaced_whole_and_a_failed_write_leaves_the_old_one_and_no_temporary_file(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2}, indent=1)
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # not JSON: fails partway
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_cache_follows_lookahead_chat_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "cache"


def test_a_problem_s_kind_decides_what_a_person_is_told_whatever_the_technical_wording():
    err = ModelFileError("a reworded technical text that names no known phrase", kind=KIND_TOO_SLOW)
    assert err.kind == KIND_TOO_SLOW and err.message == plain_message(KIND_TOO_SLOW)
    assert "took too long" in err.message
