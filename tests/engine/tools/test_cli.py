"""The engine's command line: the exact interface, and one clear line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def engine_cli(*args: str, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra_env)
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


@pytest.mark.model
def test_generate_json_has_the_documented_fields():
    r = engine_cli("generate", "--prompt", "Say hello.", "--chat", "--max-tokens", "12", "--json",
                   "--mode", "lookahead", "--window", "1", "--ngram", "3", "--guesses", "1", "--threads", "2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ["text", "token_ids", "n_tokens", "steps", "tokens_per_step", "elapsed_s", "tokens_per_s", "mode",
                "window", "ngram", "guesses", "stop_reason", "model"]:
        assert key in out
    assert out["n_tokens"] == len(out["token_ids"]) > 0
    assert (out["window"], out["ngram"], out["guesses"]) == (1, 3, 1)
    assert len(out["token_sources"]) == out["n_tokens"]
    assert set(out["token_sources"]) <= {"own", "prompt", "history", "reply", "other_chats", "window", "kept"}
    assert out["prompt_tokens"] > 5 and out["prompt_cached_tokens"] == 0  # a fresh engine: nothing cached
    assert out["prompt_tokens_per_s"] > 0


@pytest.mark.model
def test_generate_json_says_which_tokens_came_from_drafts():
    prompt = ("Turn this paragraph into a bulleted list:\n\nTo make tea, boil water, put a tea bag in a cup, pour the "
              "hot water over the tea bag, wait three minutes, remove the tea bag, and add milk or sugar if you like.")
    # Auto on a pinned curve where a batch costs twice a step: copying the paragraph pays even there.
    r = engine_cli("generate", "--prompt", prompt, "--chat", "--max-tokens", "48", "--json",
                   "--mode", "auto", "--threads", "2", LOOKAHEAD_COST_CURVE="steep")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    sources = out["token_sources"]
    assert len(sources) == out["n_tokens"]
    assert sources.count("prompt") >= 5  # the copy of the paragraph's words came from drafts of it
    assert "own" in sources


@pytest.mark.model
def test_generate_streams_text_without_json():
    r = engine_cli("generate", "--prompt", "Name a fruit.", "--chat", "--max-tokens", "8", "--mode", "plain")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def bad(tmp_path: Path) -> dict[str, list[str]]:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(os.urandom(4096))
    text = tmp_path / "text.gguf"
    text.write_text("not a model")
    return {
        "missing model": ["--model", str(tmp_path / "nope.gguf")],
        "empty model": ["--model", str(empty)],
        "random bytes": ["--model", str(noise)],
        "not gguf": ["--model", str(text)],
        "directory": ["--model", str(tmp_path)],
        "window out of range": ["--window", "99"],
        "ngram out of range": ["--ngram", "1"],
        "negative guesses": ["--guesses", "-1"],
        "bad temperature": ["--temperature", "-3"],
        "zero max tokens": ["--max-tokens", "0"],
    }


def test_bad_input_exits_non_zero_with_one_line_on_stderr(tmp_path):
    for name, extra in bad(tmp_path).items():
        r = engine_cli("generate", "--prompt", "hi", *extra)
        assert r.returncode != 0, name
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), f"{name}: {r.stderr!r}"
        assert "Traceback" not in r.stderr


@pytest.mark.model
def test_a_prompt_longer_than_the_context_is_refused_with_a_reason(tmp_path):
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("word " * 3000)
    r = engine_cli("generate", "--prompt-file", str(long_prompt), "--ctx", "256", "--max-tokens", "4")
    assert r.returncode == 2
    assert "context" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_prompt_is_a_usage_error():
    r = engine_cli("generate")
    assert r.returncode == 2 and r.stderr.startswith("error:")


BAD_SAMPLING = {
    "negative top-k": ["--top-k", "-1"],
    "top-k not a number": ["--top-k", "many"],
    "zero top-p": ["--top-p", "0"],
    "min-p of 1": ["--min-p", "1"],
    "penalty below 1": ["--repeat-penalty", "0.5"],
    "penalty above 2": ["--repeat-penalty", "3"],
    "negative penalty window": ["--repeat-last-n", "-1"],
    "huge penalty window": ["--repeat-last-n", "100000"],
    "negative DRY": ["--dry", "-0.5"],
    "DRY base of 1": ["--dry-base", "1"],
    "DRY allowing nothing": ["--dry-allowed-length", "0"],
}


@pytest.mark.parametrize("extra", BAD_SAMPLING.values(), ids=BAD_SAMPLING.keys())
def test_bad_sampling_values_exit_2_with_one_error_line(extra):
    r = engine_cli("generate", "--prompt", "hi", *extra)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr


@pytest.mark.model
def test_bench_runs_at_the_app_s_settings_or_the_ones_given_and_counts_the_replies_that_looped():
    def bench(*extra: str) -> dict:
        r = engine_cli("bench", "--only", "chat-hello", "--max-tokens", "8", "--no-references", "--pairs", "2",
                       "--json", "--threads", "2", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    default = bench()
    assert default["summary"]["settings"] == "greedy, DRY 0.8 (base 1.75, 2 tokens free) over the reply, loop guard on"
    assert default["loop_guard"] and default["sampling"]["dry_multiplier"] == 0.8
    given = bench("--repeat-penalty", "1.1", "--dry", "0", "--no-loop-guard", "--temperature", "0.7", "--seed", "7")
    assert given["summary"]["settings"] == ("temperature 0.7, seed 7, top-k 40, top-p 0.95, min-p 0.05, repeat "
                                           "penalty 1.1 over the last 64 tokens, loop guard off")
    for out in (default, given):
        s = out["summary"]
        assert s["looped"] == 0 and s["geomean_not_looped"] == s["geomean"] > 0 and s["identical"] == 1
        # what the timed runs made of the cost curve, per batch size seen: a price and the steps behind it
        live = out["references"]["live_costs"]
        assert all(int(n) > 1 and v["cost"] >= 1.0 and v["samples"] >= 1 for n, v in live.items()), live


@pytest.mark.model
def test_generate_passes_the_sampling_controls_and_stop_strings_to_the_engine():
    def generate(*extra: str) -> dict:
        r = engine_cli("generate", "--prompt", "Name three rivers.", "--chat", "--max-tokens", "24", "--json",
                       "--mode", "plain", "--threads", "2", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    greedy = generate()
    assert generate("--temperature", "1.5", "--seed", "3", "--top-k", "1")["token_ids"] == greedy["token_ids"]
    assert generate("--repeat-penalty", "1.5")["token_ids"] != greedy["token_ids"]
    stop = greedy["text"][len(greedy["text"]) // 2 :][:3]
    cut = generate("--stop", "never seen §§", "--stop", stop)
    assert cut["text"] == greedy["text"][: greedy["text"].find(stop)] and cut["stop_reason"] == "stop_string"


@pytest.mark.model
def test_generate_with_attached_files_places_them_and_drafts_from_them(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# Pump P7\n\nThe pump P7 starts at 60 percent speed and ramps up over thirty seconds. "
                     "Its valve closes twenty seconds after it stops.\n", encoding="utf-8")
    r = engine_cli("generate", "--chat", "--attach", str(notes), "--prompt",
                   "Copy the attached notes word for word.", "--max-tokens", "40", "--json", "--mode", "auto",
                   "--threads", "2", LOOKAHEAD_COST_CURVE="flat")  # Auto drafts whenever it has a draft
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["documents"]["whole"] and out["documents"]["seen"] == {"notes.md": 1.0}
    assert out["documents"]["citations"] == [{"name": "notes.md", "where": "whole file"}]
    assert out["accepted_by_source"].get("document", 0) > 5, out["accepted_by_source"]
    assert "attached (whole): notes.md 100%" in r.stderr


def test_an_attachment_that_cannot_be_used_ends_with_one_error_line_naming_it(tmp_path):
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 10)
    r = engine_cli("generate", "--chat", "--attach", str(blob), "--prompt", "What is this?")
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"error: cannot attach {blob}: this is not a text file (it holds binary data)"
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    r = engine_cli("bench", "--attach-dir", str(empty))
    assert r.returncode == 2 and "no files to attach" in r.stderr


@pytest.mark.parametrize("pairs", ["3", "0", "34"])
def test_bench_refuses_pairs_that_are_not_whole_a_b_b_a_blocks_within_its_bound(capsys, pairs):
    from engine.tools.cli import main

    assert main(["bench", "--pairs", pairs, "--only", "chat-hello"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"error: --pairs takes an even number from 2 to 32 (whole A-B-B-A blocks), not {pairs}"]


@pytest.mark.model
def test_tune_on_a_busy_pc_ends_with_one_line_saying_so(monkeypatch, capsys, model_path):
    from engine.costs.calibration import MachineBusy
    from engine.decoding.runtime import Engine
    from engine.tools.cli import main

    def busy(self, refresh=True, **kwargs):
        raise MachineBusy(32)

    monkeypatch.setattr(Engine, "tune", busy)
    assert main(["tune", "--model", str(model_path), "--threads", "1"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err[-1].startswith("error: another program was using the CPU") and "Traceback" not in "\n".join(err)


def test_the_command_line_keeps_the_modules_it_loaded_out_of_the_collector_s_full_passes():
    # A full pass walks every object the process holds; in the middle of a reply it cost about 10 ms.
    import gc

    from engine.tools.cli import main

    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        assert main(["no-such-command"]) != 0
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
