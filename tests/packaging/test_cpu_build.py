"""The llama.cpp build in use: our patch applied, no AMX matrix code (it crashes on Xeons with AMX), a clear
error if there is."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from engine import Engine, NativeError
from engine.llama import backend
from engine.llama.kernels import batch_kernels

SETUP = Path(__file__).resolve().parents[2] / "packaging" / "setup-venv.sh"


def test_the_installed_llama_cpp_reports_no_amx():
    features = backend.system_features()
    assert "AVX" in features or "NEON" in features or "SSE3" in features, features  # the parse found the CPU line
    assert {k: v for k, v in features.items() if k.startswith("AMX") and v != "0"} == {}


def test_the_system_info_is_parsed_into_feature_values(monkeypatch):
    info = b"CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info)
    assert backend.system_features() == {"SSE3": "1", "AVX512": "1", "AMX_INT8": "1", "REPACK": "1"}


def test_a_llama_cpp_with_amx_is_refused_with_how_to_rebuild(monkeypatch):
    monkeypatch.delenv("LOOKAHEAD_ALLOW_AMX", raising=False)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 1 | ")
    with pytest.raises(backend.UnsupportedBuildError) as err:
        backend.check_build()
    message = str(err.value)
    assert "AMX_INT8" in message and "-mno-amx-int8" in message and "setup-venv.sh" in message
    assert isinstance(err.value, NativeError)  # the app and the CLI show NativeErrors as messages


def test_the_engine_refuses_an_amx_build_before_loading_the_model(monkeypatch, model_path):
    monkeypatch.delenv("LOOKAHEAD_ALLOW_AMX", raising=False)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 1 | ")
    monkeypatch.setattr(backend, "_backend_ready", False)
    with pytest.raises(backend.UnsupportedBuildError):
        Engine(model_path, n_ctx=256, n_threads=1)


def test_the_source_build_carries_the_no_amx_flags_and_its_own_wheel_folder():
    text = SETUP.read_text(encoding="utf-8")
    assert "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in text
    assert "-DCMAKE_C_FLAGS='$NO_AMX'" in text and "-DCMAKE_CXX_FLAGS='$NO_AMX'" in text
    assert "--no-cache-dir" in text and "--wheel-dir" in text
    assert backend.NO_AMX_FLAGS in text  # the guard's advice and the set-up agree


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None, reason="ldd: Linux only")
def test_qts_xcb_platform_plugin_finds_every_library_it_needs():
    import PySide6

    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    assert plugin.is_file(), plugin
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    assert missing == [], f"install these for a window on X11 (packaging/system-deps.sh): {missing}"


# --- the llama.cpp patch every build path applies ---

PACKAGING = SETUP.parent


def _llama_source_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("llama_source", PACKAGING / "llama_source.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_build_path_compiles_the_patched_llama_source():
    for script in ("setup-venv.sh", "build-common.sh", "build-windows.ps1"):
        assert "llama_source.py" in (PACKAGING / script).read_text(encoding="utf-8"), script
    assert "src=$(llama_source)" in (PACKAGING / "build-common.sh").read_text(encoding="utf-8")
    for script in ("build-linux.sh", "build-macos.sh"):  # through build-common.sh's install_llama
        text = (PACKAGING / script).read_text(encoding="utf-8")
        assert 'install_llama "$PORTABLE_CMAKE_ARGS"' in text and "llama_is_current" in text, script
    for script in ("setup-venv.sh", "build-linux.sh", "build-macos.sh", "build-windows.ps1"):
        assert "--no-binary llama-cpp-python" not in (PACKAGING / script).read_text(encoding="utf-8"), script


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the kernel is x86 code")
def test_the_installed_llama_cpp_carries_the_small_batch_kernel():
    """The README's set-up builds the patched source: its CPU backend has the one-pass Q4_1 kernel for batches."""
    libs = list((Path(llama_cpp.__file__).parent / "lib").glob("libggml-cpu*"))
    assert libs, "no ggml CPU backend library next to llama_cpp"
    assert any(b"ggml_gemm_q4_1_q8_1_tile" in lib.read_bytes() for lib in libs), "unpatched llama.cpp installed"
    # and says so in its system info, which engine tune and the model info read
    assert batch_kernels(backend.system_features()).get("Q4_1") == "tile-batches"


def _vendored_file(tmp_path, source, text: str):
    vendored = tmp_path / "src" / source.VENDORED / "ggml" / "src" / "ggml-cpu"
    vendored.mkdir(parents=True)
    (vendored / "ggml-cpu.c").write_text(text, encoding="utf-8")
    return vendored / "ggml-cpu.c"


def test_a_llama_cpp_other_than_the_patches_base_stops_the_build_and_names_the_file(tmp_path):
    source = _llama_source_module()
    changed = _vendored_file(tmp_path, source, "int main(void) { return 0; }\n")
    with pytest.raises(SystemExit) as stop:
        source.apply_patches(tmp_path / "src")
    said = str(stop.value)
    assert "ggml/src/ggml-cpu/ggml-cpu.c is not the file the patches were made on" in said, said
    assert changed.read_text(encoding="utf-8") == "int main(void) { return 0; }\n"  # untouched


def test_a_patch_that_no_longer_applies_stops_the_build_and_says_why(tmp_path, monkeypatch):
    source = _llama_source_module()
    base, patches = source.series()
    assert len(patches) >= 4 and all(patch.is_file() for patch in patches)
    assert "ggml/src/ggml-cpu/ggml-cpu.c" in base
    # past the base check (as if the file were the base), the first patch's context is not found
    monkeypatch.setattr(source, "series", lambda: ({}, patches))
    changed = _vendored_file(tmp_path, source, "int main(void) { return 0; }\n")
    with pytest.raises(SystemExit) as stop:
        source.apply_patches(tmp_path / "src")
    assert "no longer applies" in str(stop.value) and patches[0].name in str(stop.value)
    assert changed.read_text(encoding="utf-8") == "int main(void) { return 0; }\n"  # untouched
    assert source.key().startswith(source.VERSION + "+")


def test_gcc_only_constructs_in_the_patches_stay_inside_the_macros_that_give_msvc_its_own():
    """GCC-only constructs in the patches' added code only inside the macros that pick each compiler's own (MSVC
    itself is untested: docs/BUILDING.md)."""
    source = _llama_source_module()
    _, patches = source.series()
    for patch in patches:
        added = [line[1:] for line in patch.read_text(encoding="utf-8").splitlines()
                 if line.startswith("+") and not line.startswith("+++")]
        gnu_only = [line for line in added if ("__attribute__" in line or "__builtin_" in line or "typeof" in line)
                    and not line.startswith("#define GGML_TILE_")]
        assert gnu_only == [], (patch.name, gnu_only)


def _changed_lines(patch: Path, sign: str) -> list[str]:
    """The lines a patch adds (sign "+") or removes ("-"), less blank lines, lone braces and preprocessor closers."""
    lines = patch.read_text(encoding="utf-8").split("\ndiff --git ", 1)[1].splitlines()
    changed = [line[1:] for line in lines if line.startswith(sign) and not line.startswith(sign * 3)]
    return [line for line in changed if line.strip() not in ("", "{", "}", "};", "#else", "#endif")]


def test_no_patch_part_rewrites_lines_an_earlier_part_added():
    # Each part is one kernel family or mechanism in its final form: it changes upstream's lines and adds its own,
    # never another part's (a series that records how the code was reached would undo earlier parts' lines).
    _, patches = _llama_source_module().series()
    added: dict[str, str] = {}
    for patch in patches:
        rewritten = [line for line in _changed_lines(patch, "-") if line in added]
        assert rewritten == [], (patch.name, [(added[line], line) for line in rewritten][:3])
        added.update((line, patch.name) for line in _changed_lines(patch, "+"))

