"""Model → Library and ``--list-models``: GGUF files found in other apps' folders, from their headers alone.

Every test builds a temporary home with the apps' layouts (LM Studio, a Hugging Face hub snapshot
of symlinks, an Ollama manifest and blob, GPT4All's and Jan's folders) and points HOME, the XDG
variables and HF_HOME at it, so nothing outside the test's own folders is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.settings import AppSettings
from app.widgets.library import COLUMNS
from engine import default_model_path
from engine.library import names, walk
from engine.library.folders import KIND_FILE, SOURCE_BUNDLED, SOURCE_USER, LibraryRoot, known_roots, library_roots
from engine.library.walk import HeaderCache, scan
from engine.llama.models import GgufSummary, check_gguf
from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, OFFSCREEN_NOISE, quick_settings
from tests.helpers.optional import present
from tests.helpers.tiny_models import write_tiny_llama, write_tiny_mamba

REPO = Path(__file__).resolve().parents[3]
PERMISSION_DENIED = "the file cannot be opened (permission denied)"
SYMLINK_LOOP = "a symlink loop: it links back to a folder that contains it"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class FakeHome:
    """The temporary home and the files the scan must report."""

    root: Path  # everything the test made is under here
    home: Path
    env: dict[str, str]
    lm_studio: Path  # a tiny llama, LM Studio's publisher/model/file layout
    hf_snapshot: Path  # a symlink in snapshots/<rev>/ to a tiny mamba in blobs/
    ollama_blob: Path  # a tiny llama without an extension, named by a manifest
    unreadable: Path  # in GPT4All's folder
    truncated: Path  # in Jan's folder
    loop: Path  # a folder symlink to its parent, in LM Studio's tree


def make_fake_home(root: Path, unreadable: bool = True) -> FakeHome:
    home = root / "home"
    data = root / "xdg-data"  # XDG_DATA_HOME away from ~/.local/share: the scan must follow it
    hf_home = root / "hf-home"
    env = {"HOME": str(home), "XDG_DATA_HOME": str(data), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache"), "HF_HOME": str(hf_home)}

    lm_dir = home / ".lmstudio" / "models" / "tiny-pub" / "tiny-llama-GGUF"
    lm_dir.mkdir(parents=True)
    lm_studio = write_tiny_llama(lm_dir / "tiny-llama-f16.gguf")
    (lm_dir / "README.md").write_text("not a model")
    loop = lm_dir / "loop"
    loop.symlink_to("..", target_is_directory=True)

    repo = hf_home / "hub" / "models--tiny-org--tiny-mamba-GGUF"
    (repo / "blobs").mkdir(parents=True)
    blob = write_tiny_mamba(repo / "blobs" / "tmp")
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    blob = blob.rename(repo / "blobs" / digest)
    for rev in ("1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222"):
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "tiny-mamba.gguf").symlink_to(Path("..") / ".." / "blobs" / digest)  # two revisions, one blob
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    hf_snapshot = snap / "tiny-mamba.gguf"

    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    tmp_blob = write_tiny_llama(ollama / "blobs" / "tmp", context_length=4096)
    digest = hashlib.sha256(tmp_blob.read_bytes()).hexdigest()
    ollama_blob = tmp_blob.rename(ollama / "blobs" / f"sha256-{digest}")
    (ollama / "blobs" / f"sha256-{'0' * 64}").write_text("{}")  # the template layer's blob
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tinyllama" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": f"sha256:{'1' * 64}"},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
             "size": ollama_blob.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{'0' * 64}", "size": 2},
        ],
    }))

    gpt4all = data / "nomic.ai" / "GPT4All"
    gpt4all.mkdir(parents=True)
    secret = gpt4all / "secret.gguf"
    if unreadable:
        write_tiny_llama(secret)
        secret.chmod(0)

    jan = data / "Jan" / "data" / "llamacpp" / "models" / "tiny"
    jan.mkdir(parents=True)
    whole = write_tiny_llama(root / "whole.gguf").read_bytes()
    truncated = jan / "model.gguf"
    truncated.write_bytes(whole[: len(whole) // 2])
    return FakeHome(root, home, env, lm_studio, hf_snapshot, ollama_blob, secret, truncated, loop)


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app_home: Path) -> Iterator[FakeHome]:
    """The fake apps' folders, with the process environment pointing at them (as the app reads it)."""
    fake = make_fake_home(tmp_path)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "OLLAMA_MODELS", "USERPROFILE", "LOCALAPPDATA", "APPDATA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in fake.env.items():
        monkeypatch.setenv(name, value)
    yield fake
    if fake.unreadable.exists():
        fake.unreadable.chmod(0o600)  # so pytest can delete it


@pytest.fixture
def unreadable_as_root(fake_home: FakeHome, monkeypatch: pytest.MonkeyPatch) -> None:
    """root reads a file of mode 000 anyway: the library is told it cannot, as anyone else would be."""
    if not IS_ROOT:
        return
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == fake_home.unreadable and mode & os.R_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def home_roots(fake: FakeHome, folders: tuple[str, ...] = ()) -> list[LibraryRoot]:
    """The roots the app scans with this environment, less system-wide ones outside the test's folders."""
    roots = library_roots(folders, env=fake.env, platform="linux")
    kept = [r for r in roots if r.kind == KIND_FILE or Path(r.path).is_relative_to(fake.root)]
    assert {r.path for r in roots} - {r.path for r in kept} <= {"/usr/share/ollama/.ollama/models"}
    return kept


def rows(result: walk.ScanResult) -> set[tuple]:
    return {
        (m.path, m.name, m.source, m.architecture, m.file_type, m.context_length, m.has_chat_template,
         m.can_lookahead, m.error is not None)
        for m in result.models
    }


def expected_rows(fake: FakeHome) -> set[tuple]:
    bundled = str(default_model_path())
    return {
        # Its general.name is a training tag ("Smollm2 135M 8k Lc100K Mix1 Ep2"): the file's name is shown instead.
        (bundled, "SmolLM2-135M-Instruct.Q4_1", SOURCE_BUNDLED, "llama", "Q4_1", 8192, True, True, False),
        (str(fake.lm_studio), "tiny-llama-test", "LM Studio", "llama", "F16", 2048, False, True, False),
        (str(fake.hf_snapshot), "tiny-org/tiny-mamba-GGUF/tiny-mamba.gguf", "Hugging Face", "mamba", "ALL_F32",
         1024, False, False, False),
        (str(fake.ollama_blob), "tinyllama:latest", "Ollama", "llama", "F16", 4096, False, True, False),
        (str(fake.truncated), "model.gguf", "Jan", "", "", None, False, False, True),
    }


def expected_skipped(fake: FakeHome) -> set[tuple[str, str, str]]:
    return {(str(fake.unreadable), PERMISSION_DENIED, "GPT4All"), (str(fake.loop), SYMLINK_LOOP, "LM Studio")}


# --- the name shown for a model ---


@pytest.mark.parametrize("tag", [
    "Smollm2 135M 8k Lc100K Mix1 Ep2", "checkpoint-1200", "Qwen2 0.5B sft step2000", "run 3f2a9c1d7", "Models",
    "hf_model", "  ", "",
])
def test_a_metadata_name_that_is_a_training_tag_or_a_default_gives_way_to_the_file_name(tag):
    assert names.name_is_training_tag(tag)
    assert names.friendly_name(tag, "/m/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"


@pytest.mark.parametrize("name", [
    "Llama 3.2 1B Instruct", "Qwen2.5 0.5B Instruct", "Mistral 7B Instruct v0.3", "gemma-2-2b-it",
    "Phi 3 Mini 4k Instruct", "Meta-Llama-3.1-8B-Instruct", "DeepSeek R1 Distill Qwen 1.5B",
])
def test_a_metadata_name_people_would_give_a_model_is_kept(name):
    assert not names.name_is_training_tag(name)
    assert names.friendly_name(f" {name} ", "/m/model-q4_k_m.gguf") == name


def test_a_file_without_a_metadata_name_is_named_after_the_file():
    assert names.friendly_name(None, Path("/m/tiny.Q8_0.gguf")) == "tiny.Q8_0"


# --- where the apps keep their models ---


def test_each_os_has_the_apps_folders_from_their_own_documentation():
    linux = {(r.source, r.path) for r in known_roots({"HOME": "/h"}, "linux")}
    assert {("LM Studio", "/h/.lmstudio/models"), ("LM Studio", "/h/.cache/lm-studio/models"),
            ("Hugging Face", "/h/.cache/huggingface/hub"), ("GPT4All", "/h/.local/share/nomic.ai/GPT4All"),
            ("Jan", "/h/.local/share/Jan/data/llamacpp/models"), ("Jan", "/h/.config/Jan/data/models"),
            ("Jan", "/h/jan/models"), ("Ollama", "/h/.ollama/models"),
            ("Ollama", "/usr/share/ollama/.ollama/models")} <= linux
    mac = {(r.source, r.path) for r in known_roots({"HOME": "/Users/u"}, "darwin")}
    assert {("GPT4All", "/Users/u/Library/Application Support/nomic.ai/GPT4All"),
            ("Jan", "/Users/u/Library/Application Support/Jan/data/llamacpp/models"),
            ("Ollama", "/Users/u/.ollama/models"), ("Hugging Face", "/Users/u/.cache/huggingface/hub")} <= mac
    assert not any(p.startswith("/usr/share") for _, p in mac)
    win_env = {"USERPROFILE": "C:/Users/u", "LOCALAPPDATA": "C:/Users/u/AppData/Local",
               "APPDATA": "C:/Users/u/AppData/Roaming"}
    win = {(r.source, Path(r.path).as_posix()) for r in known_roots(win_env, "win32")}
    assert {("LM Studio", "C:/Users/u/.lmstudio/models"), ("GPT4All", "C:/Users/u/AppData/Local/nomic.ai/GPT4All"),
            ("Jan", "C:/Users/u/AppData/Roaming/Jan/data/llamacpp/models"),
            ("Ollama", "C:/Users/u/.ollama/models")} <= win


def test_the_environment_moves_the_folders_as_it_moves_the_apps():
    env = {"HOME": "/h", "HF_HUB_CACHE": "/hub", "OLLAMA_MODELS": "/ollama", "XDG_DATA_HOME": "/data"}
    roots = {(r.source, r.path, r.kind) for r in known_roots(env, "linux")}
    assert ("Hugging Face", "/hub", "hf") in roots
    assert not any(r[0] == "Hugging Face" and r[1] != "/hub" for r in roots)
    assert ("Ollama", "/ollama", "ollama") in roots
    assert ("GPT4All", "/data/nomic.ai/GPT4All", "tree") in roots
    assert ("Hugging Face", "/hfh/hub", "hf") in {
        (r.source, r.path, r.kind) for r in known_roots({"HOME": "/h", "HF_HOME": "/hfh"}, "linux")}
    relative = {r.path for r in known_roots({"HOME": "/h", "XDG_DATA_HOME": "rel"}, "linux")}
    assert "/h/.local/share/nomic.ai/GPT4All" in relative  # a relative XDG path is ignored, as the spec says


def test_what_lookahead_an_architecture_gets_by_its_name_alone():
    assert names.lookahead_block_reason("llama") is None and names.lookahead_kind("llama") == "lookahead"
    assert "recurrent" in present(names.lookahead_block_reason("mamba")) and names.lookahead_kind("mamba") == "plain"
    assert "hybrid" in present(names.lookahead_block_reason("jamba")) and names.lookahead_kind("jamba") == "plain"
    # llama.cpp keeps earlier states of these (llm_arch_supports_rs_rollback): one draft per step, no window
    for arch in ("lfm2", "qwen35", "nemotron_h"):
        assert names.lookahead_block_reason(arch) is None and names.lookahead_kind(arch) == "drafts only"


def test_the_header_counts_parameters_as_llama_cpp_does(engine):
    """The bundled model's count from its header equals llama_model_n_params of the loaded model."""
    assert check_gguf(default_model_path()).n_params == engine.info.n_params


# --- scanning ---


def test_a_scan_of_the_fake_home_gives_exactly_the_expected_rows_and_skipped_notes(fake_home, unreadable_as_root):
    result = scan(home_roots(fake_home))
    assert not result.cancelled
    assert rows(result) == expected_rows(fake_home)
    assert {(s.path, s.reason, s.source) for s in result.skipped} == expected_skipped(fake_home)
    (truncated,) = [m for m in result.models if not m.ok]
    assert "truncated" in present(truncated.error)


def test_a_scan_lists_every_folder_it_searched_whether_it_exists_and_how_many_models_it_held(
    fake_home, unreadable_as_root
):
    roots = home_roots(fake_home, (str(fake_home.root / "not-made"),))
    result = scan(roots, cache=HeaderCache(fake_home.root / "cache.json"))
    searched = {f.path: f for f in result.searched}
    assert [f.path for f in result.searched] == [r.path for r in roots]  # in the order they were searched
    assert sum(f.models for f in result.searched) == len(result.models)
    lm_studio = str(fake_home.home / ".lmstudio" / "models")
    assert searched[lm_studio].exists and searched[lm_studio].models == 1
    jan = str(fake_home.root / "xdg-data" / "Jan" / "data" / "llamacpp" / "models")
    assert searched[jan].models == 1  # a broken file counts: it is listed, with why it cannot load
    old_lm_studio = str(fake_home.home / ".cache" / "lm-studio" / "models")
    assert not searched[old_lm_studio].exists and searched[old_lm_studio].models == 0
    assert not searched[str(fake_home.root / "not-made")].exists
    assert searched[str(default_model_path())].exists and searched[str(default_model_path())].models == 1


@pytest.mark.parametrize("digest", ["sha256:../../outside.gguf", "sha256:" + "a" * 63, "sha256:" + "A" * 64,
                                    "sha256-" + "a" * 64, "sha256:" + "a" * 64 + "/../../outside.gguf"])
def test_an_ollama_digest_that_is_not_64_hex_digits_is_skipped_and_never_leaves_blobs(
    fake_home, unreadable_as_root, digest
):
    ollama = fake_home.home / ".ollama" / "models"
    (ollama / "outside.gguf").write_bytes(fake_home.ollama_blob.read_bytes())  # what "../.." would reach
    for name in (digest, digest.replace(":", "-")):  # folders for a "/.." to cross, as both blob spellings
        (ollama / "blobs" / name.split("/")[0]).mkdir(exist_ok=True)
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "escape" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    result = scan(home_roots(fake_home))
    assert rows(result) == expected_rows(fake_home)  # the real Ollama model still, nothing outside blobs/
    assert (str(manifest), f"its model layer has an unknown digest {digest!r}") in {
        (s.path, s.reason) for s in result.skipped}


def test_a_file_reached_twice_is_listed_once(fake_home, unreadable_as_root, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "same-as-lm-studio.gguf").symlink_to(fake_home.lm_studio)
    (mine / "bundled.gguf").symlink_to(default_model_path())
    missing = tmp_path / "not-there"
    result = scan(home_roots(fake_home, (str(mine), str(fake_home.home / ".lmstudio"), str(missing))))
    paths = [m.path for m in result.models]
    assert len(paths) == len(set(paths)) == len(expected_rows(fake_home))
    assert str(mine / "same-as-lm-studio.gguf") not in paths
    assert (str(missing), "the folder does not exist (or is not a folder)", SOURCE_USER) in {
        (s.path, s.reason, s.source) for s in result.skipped}


def test_a_second_scan_reads_no_header_and_a_changed_file_is_read_again(fake_home, unreadable_as_root, monkeypatch):
    first = scan(home_roots(fake_home))
    read: list[str] = []
    real = walk.check_gguf

    def counting(path):
        read.append(str(path))
        return real(path)

    monkeypatch.setattr(walk, "check_gguf", counting)
    again = scan(home_roots(fake_home))
    assert read == [] and rows(again) == rows(first)

    changed = fake_home.lm_studio.stat().st_mtime_ns + 10**9  # a second later: no clock read, no race with it
    os.utime(fake_home.lm_studio, ns=(changed, changed))
    scan(home_roots(fake_home))
    assert read == [str(fake_home.lm_studio)]


@pytest.mark.timing
def test_a_rescan_of_a_thousand_cached_files_lists_the_folder_once_stats_each_file_once_and_is_quick(
    tmp_path, app_home, monkeypatch
):
    folder = tmp_path / "many"
    folder.mkdir()
    facts = check_gguf(write_tiny_llama(tmp_path / "one.gguf"))
    cache = HeaderCache()
    files = [folder / f"model-{i:04d}.gguf" for i in range(1000)]
    for i, path in enumerate(files):
        path.write_bytes(b"GGUF" + i.to_bytes(4, "little"))
        cache.put(str(path), path.stat(), GgufSummary(**{**facts.__dict__, "path": str(path)}))
    cache.save()
    monkeypatch.setattr(walk, "check_gguf", lambda path: pytest.fail(f"read a cached header: {path}"))
    roots = [LibraryRoot(str(folder), SOURCE_USER)]

    # The work itself, counted: one listing of the folder and one stat per file, whatever the machine's speed.
    listed: list[str] = []
    stats: dict[str, int] = {}
    real_scandir, real_stat = os.scandir, os.stat

    def counting_scandir(path="."):
        listed.append(os.fspath(path))
        return real_scandir(path)

    def counting_stat(path, *args, **kwargs):
        stats[os.fspath(path)] = stats.get(os.fspath(path), 0) + 1
        return real_stat(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "scandir", counting_scandir)
        patch.setattr(os, "stat", counting_stat)
        result = scan(roots, cache=HeaderCache())  # the cache as a new run reads it
    assert len(result.models) == 1000 and all(m.ok for m in result.models)
    assert listed == [str(folder)]
    assert {str(p): stats.get(str(p), 0) for p in files} == {str(p): 1 for p in files}

    # Real time, against the least any rescan must do, timed here in the same run: read the cache file, list
    # the folder, stat each file. The scan takes about 3x that (~50 ms on a quiet PC); the bound is a second,
    # or 20x that least work on a machine slowed by other programs: a rescan that reads the cache again per
    # file, or whose work per file grows with the library, still fails, and a busy CI machine does not.
    def least_work() -> None:
        json.loads(walk.cache_path().read_text(encoding="utf-8"))
        for entry in os.scandir(folder):
            os.stat(entry.path)
            os.access(entry.path, os.R_OK)

    reference = min(_timed(least_work) for _ in range(3))
    elapsed = min(_timed(lambda: scan(roots, cache=HeaderCache())) for _ in range(3))
    assert elapsed < max(1.0, 20 * reference), (
        f"a rescan of 1,000 cached files took {elapsed:.2f} s (reading the cache and stat-ing them: {reference:.3f} s)"
    )


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_a_cache_of_another_version_or_damaged_is_ignored(app_home, tmp_path):
    path = walk.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": walk.CACHE_VERSION + 1, "entries": {"x": {}}}))
    assert HeaderCache().entries == {}
    path.write_text("{not json")
    assert HeaderCache().entries == {}


def test_a_scan_stops_between_two_files_when_cancelled(fake_home):
    cancel = threading.Event()
    seen: list[str] = []

    def progress(files: int, path: str) -> None:
        seen.append(path)
        if files == 2:
            cancel.set()

    result = scan(home_roots(fake_home), cancel, progress)
    assert result.cancelled
    assert len(seen) == 2 and len(result.models) <= 2


# --- the command line ---


def _list_models(fake: FakeHome, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "OLLAMA_MODELS")}
    env.update(fake.env)
    env["LOOKAHEAD_CHAT_HOME"] = str(fake.root / "app-home")
    env.pop("DISPLAY", None)
    env.pop("QT_QPA_PLATFORM", None)  # no display at all: the listing must not need Qt
    return subprocess.run([sys.executable, "-m", "app", "--list-models", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=True)


def test_list_models_json_prints_one_row_per_model_found_with_the_environment_of_the_app(tmp_path):
    fake = make_fake_home(tmp_path, unreadable=False)
    out = _list_models(fake, "--json")
    found = [json.loads(line) for line in out.stdout.splitlines()]
    found = [r for r in found if not r["path"].startswith("/usr/share/ollama/")]
    by_path = {r["path"]: r for r in found}
    assert set(by_path) == {row[0] for row in expected_rows(fake)}
    assert by_path[str(fake.ollama_blob)] == {
        "path": str(fake.ollama_blob), "name": "tinyllama:latest", "architecture": "llama",
        "parameters": check_gguf(fake.ollama_blob).n_params, "quantization": "F16",
        "size_bytes": fake.ollama_blob.stat().st_size, "context_length": 4096, "chat_template": False,
        "lookahead": True, "lookahead_kind": "lookahead", "source": "Ollama", "error": None,
    }
    assert by_path[str(fake.hf_snapshot)]["lookahead"] is False
    assert by_path[str(fake.truncated)]["error"].startswith("truncated")
    assert f"skipped: {fake.loop}: {SYMLINK_LOOP}" in out.stderr


def test_list_models_never_imports_qt(tmp_path):
    fake = make_fake_home(tmp_path, unreadable=False)
    env = {**os.environ, **fake.env, "LOOKAHEAD_CHAT_HOME": str(tmp_path / "app-home")}
    code = ("import sys; from app.__main__ import main; code = main(['--list-models']); "
            "assert not any(m.startswith('PySide6') for m in sys.modules), 'Qt was imported'; sys.exit(code)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                   check=True)


def test_list_models_prints_a_table_with_the_app_each_model_was_found_in(tmp_path):
    fake = make_fake_home(tmp_path, unreadable=False)
    lines = _list_models(fake).stdout.splitlines()
    assert lines[0].split()[:3] == ["PATH", "NAME", "ARCHITECTURE"]
    (ollama,) = [line for line in lines if line.startswith(str(fake.ollama_blob))]
    assert ollama.split()[1:] == ["tinyllama:latest", "llama", "270K", "F16", "624", "KB", "4,096", "no", "yes",
                                  "Ollama"]
    assert any(line.strip().startswith("! truncated") for line in lines)


# --- settings ---


def test_settings_keep_folders_and_per_model_values_and_drop_hand_edited_bad_ones(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({
        "library_folders": ["/models", "/more"],
        "per_model": {"/a.gguf": {"n_ctx": 2048, "temperature": 1, "top_p": "high", "system_prompt": 3,
                                  "stop_strings": ["</s>", 5], "unknown": 1},
                      "/b.gguf": "not a dict"},
    }))
    s = AppSettings.load(path)
    assert s.library_folders == ["/models", "/more"]
    assert s.per_model == {"/a.gguf": {"n_ctx": 2048, "temperature": 1.0}}
    path.write_text(json.dumps({"library_folders": "/models", "per_model": ["x"]}))
    s = AppSettings.load(path)
    assert s.library_folders == [] and s.per_model == {}


def test_per_model_values_are_remembered_and_applied_by_model_file():
    s = AppSettings(n_ctx=1024, temperature=0.2, system_prompt="Be brief.")
    s.remember_model_settings("/a.gguf")
    s.n_ctx, s.temperature, s.system_prompt = 4096, 0.9, "Be thorough."
    assert not s.apply_model_settings("/b.gguf")
    assert s.apply_model_settings("/a.gguf")
    assert (s.n_ctx, s.temperature, s.system_prompt) == (1024, 0.2, "Be brief.")


# --- the dialog ---


def _open_dialog(qtbot, folders: list[str] | None = None):
    """The library dialog, shown, once its first scan is in the table."""
    from app.widgets.library import LibraryDialog

    dialog = LibraryDialog(folders or [])
    qtbot.addWidget(dialog)
    dialog.show()
    with qtbot.waitSignal(dialog.scanned, timeout=30_000):
        pass
    return dialog


def _double_click(qtbot, dialog, row: int) -> None:
    index = dialog.proxy.index(row, 0)
    dialog.table.scrollTo(index)
    at = dialog.table.visualRect(index).center()
    qtbot.mouseClick(dialog.table.viewport(), Qt.MouseButton.LeftButton, pos=at)  # the press a double-click follows
    qtbot.mouseDClick(dialog.table.viewport(), Qt.MouseButton.LeftButton, pos=at)


@OFFSCREEN_NOISE
def test_the_dialog_shows_the_rows_marks_lookahead_and_lists_what_it_skipped(qtbot, fake_home, unreadable_as_root):
    dialog = _open_dialog(qtbot)
    shown = {dialog.model_at(row).path for row in range(dialog.row_count())}
    assert shown == {row[0] for row in expected_rows(fake_home)}
    assert dialog.status_label.text() == "4 models, 1 broken, 2 skipped"
    assert dialog.tabs.tabText(1) == "Skipped (2)"
    assert {(dialog.skipped_table.item(i, 0).text(), dialog.skipped_table.item(i, 1).text())
            for i in range(dialog.skipped_table.rowCount())} == {(p, r) for p, r, _ in expected_skipped(fake_home)}

    mamba = dialog.row_of(str(fake_home.hf_snapshot))
    lookahead = dialog.proxy.index(mamba, COLUMNS.index("Lookahead"))
    assert lookahead.data() == "no" and "recurrent" in lookahead.data(Qt.ItemDataRole.ToolTipRole)
    assert dialog.proxy.index(mamba, COLUMNS.index("Found in")).data() == "Hugging Face"
    assert dialog.proxy.index(dialog.row_of(str(fake_home.ollama_blob)), 0).data() == "tinyllama:latest"

    dialog.filter_edit.setText("MAMBA")
    assert dialog.row_count() == 1 and dialog.model_at(0).path == str(fake_home.hf_snapshot)
    dialog.filter_edit.clear()

    dialog.table.sortByColumn(COLUMNS.index("Size"), Qt.SortOrder.DescendingOrder)
    assert dialog.model_at(0).source == "Bundled"  # sizes sort as numbers: 98 MB before 624 KB


@OFFSCREEN_NOISE
def test_the_dialog_marks_the_loaded_model_selects_its_row_and_follows_a_new_one(qtbot, fake_home):
    from app.widgets.library import LOADED_MARK, LibraryDialog

    dialog = LibraryDialog([], loaded_path=str(fake_home.lm_studio))
    qtbot.addWidget(dialog)
    dialog.show()
    with qtbot.waitSignal(dialog.scanned, timeout=30_000):
        pass
    row = dialog.row_of(str(fake_home.lm_studio))
    assert dialog.loaded_row() == row >= 0
    assert dialog.proxy.index(row, 0).data() == f"tiny-llama-test  {LOADED_MARK}"
    assert dialog.proxy.index(row, 0).data(Qt.ItemDataRole.FontRole).bold()
    assert present(dialog.selected_model()).path == str(fake_home.lm_studio)
    other = dialog.row_of(str(fake_home.ollama_blob))
    assert dialog.proxy.index(other, 0).data() == "tinyllama:latest"
    assert not dialog.proxy.index(other, 0).data(Qt.ItemDataRole.FontRole).bold()

    dialog.set_loaded_path(str(fake_home.ollama_blob))  # another model was loaded meanwhile
    assert dialog.loaded_row() == dialog.row_of(str(fake_home.ollama_blob))
    assert dialog.proxy.index(dialog.row_of(str(fake_home.lm_studio)), 0).data() == "tiny-llama-test"
    assert present(dialog.selected_model()).path == str(fake_home.ollama_blob)


@OFFSCREEN_NOISE
def test_the_dialog_lists_the_folders_it_searched_with_what_each_held(qtbot, fake_home, tmp_path):
    from app.widgets.library import SEARCHED_COLUMNS

    gone = tmp_path / "gone"
    dialog = _open_dialog(qtbot, [str(gone)])
    table = dialog.searched_table
    rows = {table.item(i, 0).text(): (table.item(i, 1).text(), table.item(i, 2).text())
            for i in range(table.rowCount())}
    assert rows[str(fake_home.home / ".lmstudio" / "models")] == ("LM Studio", "1 model")
    assert rows[str(fake_home.home / ".cache" / "lm-studio" / "models")] == ("LM Studio", "not on this PC")
    assert rows[str(gone)] == (SOURCE_USER, "not on this PC")
    assert rows[str(default_model_path())] == (SOURCE_BUNDLED, "the model that comes with the app")
    present = sum(1 for app, state in rows.values() if state != "not on this PC")
    assert dialog.tabs.tabText(2) == f"Searched ({present} of {table.rowCount()} on this PC)"
    assert [table.horizontalHeaderItem(j).text() for j in range(table.columnCount())] == list(SEARCHED_COLUMNS)


@OFFSCREEN_NOISE
def test_a_broken_file_shows_why_instead_of_loading_and_a_good_one_is_chosen(qtbot, fake_home, dialogs):
    dialog = _open_dialog(qtbot)
    chosen: list[str] = []
    dialog.modelChosen.connect(chosen.append)

    _double_click(qtbot, dialog, dialog.row_of(str(fake_home.truncated)))
    assert chosen == [] and dialog.isVisible()
    box = dialog.error_box
    assert box is not None and box.isVisible()
    assert box.text().startswith("This file is cut short: it holds ")  # plain words first
    assert box.detailedText().startswith("truncated") and str(fake_home.truncated) in box.detailedText()
    box.close()

    _double_click(qtbot, dialog, dialog.row_of(str(fake_home.ollama_blob)))
    assert chosen == [str(fake_home.ollama_blob)] and not dialog.isVisible()


@OFFSCREEN_NOISE
def test_added_folders_are_scanned_and_removed_ones_are_not(qtbot, fake_home, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    own = write_tiny_llama(mine / "own.gguf")
    dialog = _open_dialog(qtbot)
    changes: list[list[str]] = []
    dialog.foldersChanged.connect(changes.append)
    with qtbot.waitSignal(dialog.scanned, timeout=30_000):
        dialog.add_folder(str(mine))
    assert dialog.row_of(str(own)) >= 0
    assert dialog.model_at(dialog.row_of(str(own))).source == SOURCE_USER
    with qtbot.waitSignal(dialog.scanned, timeout=30_000):
        dialog.remove_folder(str(mine))
    assert dialog.row_of(str(own)) == -1
    assert changes == [[str(mine)], []]


@OFFSCREEN_NOISE
@pytest.mark.timing
def test_closing_the_dialog_cancels_its_scan_and_ends_its_thread(qtbot, fake_home, tmp_path, monkeypatch):
    slow = tmp_path / "slow"
    slow.mkdir()
    files = [slow / f"m{i:03d}.gguf" for i in range(200)]
    for path in files:
        path.write_bytes(b"GGUF" + bytes(40))
    real = walk.check_gguf
    read: list[str] = []

    def slow_check(path: str | os.PathLike[str]) -> GgufSummary:
        read.append(str(path))
        time.sleep(0.05)
        return real(path)

    monkeypatch.setattr(walk, "check_gguf", slow_check)
    from app.widgets.library import LibraryDialog

    dialog = LibraryDialog([str(slow)])
    qtbot.addWidget(dialog)
    dialog.show()
    thread = present(dialog._thread)
    with qtbot.waitSignal(thread.progressed, timeout=30_000):
        pass
    assert dialog.is_scanning()
    at_close = len(read)
    t0 = time.perf_counter()
    dialog.close()
    closing = time.perf_counter() - t0
    assert thread.isFinished() and not dialog.is_scanning()
    assert len(read) <= at_close + 1 < len(files)  # stopped between two files: at most the one being read
    # Real time: the rest of the scan would take about 10 s (200 files, 50 ms each); closing waits at most for
    # the file being read (50 ms). 3 s leaves room for a loaded CI machine and still fails a close that waits.
    assert closing < 3.0, f"closing took {closing:.2f} s"


@OFFSCREEN_NOISE
def test_closing_the_dialog_just_after_its_scan_reported_leaves_no_thread_running(qtbot, fake_home, monkeypatch):
    from app.widgets.library import LibraryDialog, ScanThread

    real_run = ScanThread.run
    slow_to_end = threading.Event()

    def run_then_linger(thread: ScanThread) -> None:  # as when a busy machine pauses the thread after it reported
        real_run(thread)
        slow_to_end.wait(0.5)

    monkeypatch.setattr(ScanThread, "run", run_then_linger)
    dialog = LibraryDialog([])
    qtbot.addWidget(dialog)
    dialog.show()
    thread = present(dialog._thread)
    try:
        with qtbot.waitSignal(dialog.scanned, timeout=30_000):
            pass
        dialog.close()
        assert thread.isFinished()  # deleting the dialog (and its thread) now would abort the app otherwise
    finally:
        slow_to_end.set()
        thread.wait()


# --- loading from the library, and each model's own settings ---


def _no_measuring(window) -> None:
    """Skip measuring this PC for each model these tests load: a measurement started just before the
    window closes can outlast the 2 s the engine's thread is given to stop, and none is needed here."""
    window.measure_status.skip()
    window.modelChanged.connect(lambda _model: window.measure_status.skip())


@OFFSCREEN_NOISE
def test_double_clicking_the_bundled_models_row_loads_it_in_the_window(make_window, qtbot, fake_home):
    window = make_window(quick_settings(model_path=str(fake_home.lm_studio)))
    _no_measuring(window)
    assert window.model.path == str(fake_home.lm_studio)
    window.menus.library_action.trigger()
    dialog = window.library_dialog
    with qtbot.waitSignal(dialog.scanned, timeout=30_000):
        pass
    bundled = str(default_model_path())
    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS) as loaded:
        _double_click(qtbot, dialog, dialog.row_of(bundled))
    assert loaded.args[0].path == bundled == window.model.path
    assert window.library_dialog is None


@OFFSCREEN_NOISE
def test_the_status_bar_names_the_loaded_model_as_the_library_does_and_the_library_marks_it(
    make_window, qtbot, fake_home
):
    window = make_window(quick_settings())
    _no_measuring(window)
    window.menus.library_action.trigger()
    dialog = window.library_dialog
    with qtbot.waitSignal(dialog.scanned, timeout=30_000):
        pass
    row = dialog.row_of(window.model.path)
    assert dialog.loaded_row() == row >= 0
    assert dialog.model_at(row).name == window.model.display_name == "SmolLM2-135M-Instruct.Q4_1"
    assert window.model_label.text().startswith(f"{window.model.display_name} · ")

    # A model loaded with the dialog open is marked there at once.
    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(str(fake_home.lm_studio))
    assert dialog.loaded_row() == dialog.row_of(str(fake_home.lm_studio))
    assert dialog.model_at(dialog.loaded_row()).name == window.model.display_name == "tiny-llama-test"
    dialog.close()


@OFFSCREEN_NOISE
def test_a_models_own_settings_come_back_when_it_is_loaded_again(make_window, qtbot, tmp_path):
    tiny = str(write_tiny_llama(tmp_path / "tiny.gguf"))
    window = make_window(quick_settings(n_ctx=1024, temperature=0.0))
    _no_measuring(window)
    bundled = window.model.path

    def load(path: str) -> None:
        with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
            window.load_model(path)

    load(tiny)
    assert window.model.n_ctx == 1024  # a model seen for the first time takes the values in use
    window.panel.temperature_spin.setValue(0.7)
    window.panel.n_ctx_spin.setValue(512)
    window.panel.set_system_prompt("Answer in one word.")
    window.panel.makeDefaultPromptRequested.emit("Answer in one word.")
    qtbot.waitUntil(lambda: AppSettings.load().model_settings(tiny).get("n_ctx") == 512, timeout=5000)

    load(bundled)
    assert window.model.n_ctx == 1024
    assert window.panel.temperature_spin.value() == 0.0 and window.panel.n_ctx_spin.value() == 1024
    assert window.settings.system_prompt == window.panel.system_prompt() != "Answer in one word."

    load(tiny)
    assert window.model.n_ctx == 512
    assert window.panel.temperature_spin.value() == pytest.approx(0.7)
    assert window.panel.system_prompt() == "Answer in one word."
    saved = AppSettings.load()
    assert saved.model_settings(tiny)["temperature"] == pytest.approx(0.7)
    assert saved.model_settings(bundled)["n_ctx"] == 1024
