"""The llama.cpp build in use: no AMX matrix code (it crashes on Xeons with AMX), a clear error if there is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from engine import Engine, NativeError, native

SETUP = Path(__file__).resolve().parent.parent / "packaging" / "setup-venv.sh"


def test_the_installed_llama_cpp_reports_no_amx():
    features = native.system_features()
    assert "AVX" in features or "NEON" in features or "SSE3" in features, features  # the parse found the CPU line
    assert {k: v for k, v in features.items() if k.startswith("AMX") and v != "0"} == {}


def test_the_system_info_is_parsed_into_feature_values(monkeypatch):
    info = b"CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info)
    assert native.system_features() == {"SSE3": "1", "AVX512": "1", "AMX_INT8": "1", "REPACK": "1"}


def test_a_llama_cpp_with_amx_is_refused_with_how_to_rebuild(monkeypatch):
    monkeypatch.delenv("LOOKAHEAD_ALLOW_AMX", raising=False)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 1 | ")
    with pytest.raises(native.UnsupportedBuildError) as err:
        native.check_build()
    message = str(err.value)
    assert "AMX_INT8" in message and "-mno-amx-int8" in message and "setup-venv.sh" in message
    assert isinstance(err.value, NativeError)  # the app and the CLI show NativeErrors as messages


def test_the_engine_refuses_an_amx_build_before_loading_the_model(monkeypatch, model_path):
    monkeypatch.delenv("LOOKAHEAD_ALLOW_AMX", raising=False)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 1 | ")
    monkeypatch.setattr(native, "_backend_ready", False)
    with pytest.raises(native.UnsupportedBuildError):
        Engine(model_path, n_ctx=256, n_threads=1)


def test_the_source_build_carries_the_no_amx_flags_and_its_own_wheel_folder():
    text = SETUP.read_text(encoding="utf-8")
    assert "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in text
    assert "-DCMAKE_C_FLAGS='$NO_AMX'" in text and "-DCMAKE_CXX_FLAGS='$NO_AMX'" in text
    assert "--no-cache-dir" in text and "--wheel-dir" in text
    assert native.NO_AMX_FLAGS in text  # the guard's advice and the set-up agree


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None, reason="ldd: Linux only")
def test_qts_xcb_platform_plugin_finds_every_library_it_needs():
    import PySide6

    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    assert plugin.is_file(), plugin
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    assert missing == [], f"install these for a window on X11 (packaging/system-deps.sh): {missing}"
