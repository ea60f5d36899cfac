"""Loading llama.cpp: its backends, its log, and the checks on the build in use.

``ensure_backend`` runs once per process before any model is loaded: it hooks llama.cpp's log (the tail is
kept so that errors can quote it, ``last_log_error``), loads ggml's backends where a portable build keeps them,
and refuses a build with AMX matrix code (``check_build``). With native.py, the thin wrappers over the C API,
the only modules that touch llama.cpp through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections import deque
from pathlib import Path

import llama_cpp as ll

from engine.llama.problems import NO_BACKEND_PHRASE


class NativeError(RuntimeError):
    """llama.cpp refused or failed an operation."""


# --- backend and logging -----------------------------------------------------

_backend_lock = threading.Lock()
_backend_ready = False
_log_lines: deque[str] = deque(maxlen=50)
_LOG_WARN, _LOG_CONT = 3, 5  # GGML_LOG_LEVEL_WARN (ERROR is 4), GGML_LOG_LEVEL_CONT (continues the last message)
_log_to_stderr = False  # also write warnings and errors to stderr as they come (report_log_to_stderr)
_last_level = 0  # the level of the message a GGML_LOG_LEVEL_CONT line continues


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs a great deal to stderr; keep the tail so errors can quote it.
    global _last_level
    if not text:
        return
    _log_lines.append(text.decode("utf-8", errors="replace"))
    if _log_to_stderr:
        if level != _LOG_CONT:
            _last_level = level
        if _last_level in (_LOG_WARN, _LOG_WARN + 1):
            os.write(2, text)


class UnsupportedBuildError(NativeError):
    """The llama.cpp in use was built with code known to crash on this machine."""


# How to build llama-cpp-python without ggml's AMX matrix code (packaging/setup-venv.sh does this).
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
REBUILD_WITHOUT_AMX = (
    f"CMAKE_ARGS=\"-DCMAKE_C_FLAGS='{NO_AMX_FLAGS}' -DCMAKE_CXX_FLAGS='{NO_AMX_FLAGS}'\" "
    "pip install --no-cache-dir --force-reinstall --no-deps --no-binary llama-cpp-python llama-cpp-python"
)


def system_features() -> dict[str, str]:
    """The CPU features llama.cpp was built with, from ``llama_print_system_info()`` ({"AVX2": "1", ...})."""
    raw = ll.llama_print_system_info()
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    features: dict[str, str] = {}
    for part in text.split("|"):
        name, sep, value = part.rpartition(":")[2].partition("=")
        if sep:
            features[name.strip()] = value.strip()
    return features


@functools.cache
def build_id() -> str:
    """The llama.cpp build in use, as its libraries' sizes and times: what a step costs and which batches are exact
    belong to the kernels of one build, so measurements kept for a model are keyed by it."""
    try:
        lib_dir = Path(ll.llama_cpp._lib._name).parent
    except AttributeError:
        return getattr(ll, "__version__", "unknown")
    parts = []
    for lib in sorted(lib_dir.glob("*ggml*")) + sorted(lib_dir.glob("*llama*")):
        try:
            st = lib.stat()
        except OSError:
            continue
        parts.append(f"{lib.name}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts) or getattr(ll, "__version__", "unknown")


def check_build() -> None:
    """Refuse a llama.cpp with AMX compiled in: its matmul dies with SIGILL on the first batch (llama.cpp PR #26954).

    ``LOOKAHEAD_ALLOW_AMX=1`` skips the check, for a llama.cpp whose AMX path is known to work.
    """
    if os.environ.get("LOOKAHEAD_ALLOW_AMX") == "1":
        return
    amx = [name for name, value in system_features().items() if name.startswith("AMX") and value not in ("", "0")]
    if amx:
        raise UnsupportedBuildError(
            f"the installed llama.cpp was built with AMX ({', '.join(sorted(amx))}), whose matrix code crashes "
            "this process on the first prompt on Intel Xeon CPUs with AMX. Rebuild llama-cpp-python without it: "
            f"{REBUILD_WITHOUT_AMX} (or delete .venv and run packaging/setup-venv.sh)"
        )


# llama_cpp's own library folder, next to its module (a PyInstaller bundle keeps it there too).
_PACKAGE_LIB_DIR = Path(os.path.abspath(os.path.dirname(ll.__file__))) / "lib"


def llama_lib_dir() -> Path:
    """The folder llama_cpp loads its libraries from (its rule): ``LLAMA_CPP_LIB_PATH``, else llama_cpp/lib."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return Path(override) if override else _PACKAGE_LIB_DIR


def _libggml(lib_dir: Path) -> ctypes.CDLL | None:
    """A handle whose ggml functions are the ones libllama calls, or None if there is no libggml to reach.

    ggml's backend registry lives in one loaded copy of libggml, and a process can hold two: a wheel cannot hold
    links, so llama_cpp/lib has libggml.so and libggml.so.0 as two files; libllama is linked against the
    second, ``llama_cpp._ggml`` opens the first, and a backend registered through it leaves llama.cpp with none
    ("no backends are loaded"). Looking the functions up through libllama's own handle (dlsym searches a
    library's dependencies after it) reaches the copy libllama uses, whatever else was loaded. Windows'
    GetProcAddress searches one module only: there the folder's libggml is opened.
    """
    libllama = ll.llama_cpp._lib
    if hasattr(libllama, "ggml_backend_load_all_from_path"):
        return libllama
    from llama_cpp._ctypes_extensions import load_shared_library

    try:
        # The file libllama was linked against in that folder: the loader hands back the copy already loaded.
        return load_shared_library("ggml", lib_dir)
    except (OSError, RuntimeError):  # no separate libggml there: ggml is linked into libllama with its backends
        return None


class BackendUnavailableError(NativeError):
    """No ggml backend could be loaded: the app's own llama.cpp libraries are missing or broken, not a model."""


def _register_backends(ggml: ctypes.CDLL, lib_dir: Path) -> None:
    """Load ggml's backends from ``lib_dir`` if none is registered yet.

    A portable build (GGML_BACKEND_DL with GGML_CPU_ALL_VARIANTS) keeps its CPU code in one library per
    instruction-set level (libggml-cpu-haswell.so ...) and registers nothing until ggml_backend_load_all*()
    is called: llama-cpp-python 0.3.x never calls it (abetlen/llama-cpp-python#2069), and ggml's default
    search path is the executable's folder. ggml scores each variant on this CPU and loads the best one
    ("load_backend: loaded CPU backend from ..." in the log). A build with its backend linked in has one
    registered already: then this does nothing.
    """
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_count.argtypes = []
    if ggml.ggml_backend_reg_count() > 0:
        return
    ggml.ggml_backend_load_all_from_path.restype = None
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(os.fsencode(lib_dir))
    if ggml.ggml_backend_reg_count() == 0:
        detail = last_log_error()
        raise BackendUnavailableError(no_backend_text(lib_dir) + (f": {detail}" if detail else ""))


def no_backend_text(lib_dir: Path | str) -> str:
    """The one wording of this failure, which engine/llama/problems.py reads back into its kind."""
    return f"{NO_BACKEND_PHRASE} from {lib_dir}"


def ensure_backend() -> None:
    """Make llama.cpp ready to load models, once per process: hook its log, load ggml's backends, check the build."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            if not os.environ.get("LOOKAHEAD_LLAMA_LOG"):
                ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            lib_dir = llama_lib_dir()
            ggml = _libggml(lib_dir)
            if ggml is not None:
                _register_backends(ggml, lib_dir)  # after the log hook: ggml logs what it loads
            ll.llama_backend_init()
            check_build()  # before any model is loaded or decoded; raised again on every later try
            _backend_ready = True


def last_log_error() -> str:
    """The last line llama.cpp logged that looks like an error (or '').

    A failure is often logged twice: "error loading model: <why>", then "failed to
    load model". The reason is the useful part, so an "error" line among the few
    just before the last "failed" line wins over it.
    """
    lines = list(_log_lines)
    for i in range(len(lines) - 1, -1, -1):
        low = lines[i].lower()
        if "error" in low or "no backends are loaded" in low:
            return lines[i].strip()
        if "failed" in low:
            for earlier in reversed(lines[max(i - 3, 0) : i]):
                if "error" in earlier.lower():
                    return earlier.strip()
            return lines[i].strip()
    return ""


def report_log_to_stderr() -> None:
    """Send llama.cpp's warnings and errors to stderr as they come, so a crash leaves its last words (the load
    probe's child, engine/llama/probe.py); the log's tail is kept for ``last_log_error`` as ever."""
    global _log_to_stderr
    ensure_backend()
    _log_to_stderr = True
    ll.llama_log_set(_log_callback, ctypes.c_void_p(0))  # also where LOOKAHEAD_LLAMA_LOG left llama.cpp's own
