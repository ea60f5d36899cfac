"""PyInstaller runtime hook: register ggml's CPU backend before the app starts.

The bundle's llama.cpp is built portable (GGML_BACKEND_DL with
GGML_CPU_ALL_VARIANTS): the CPU code lives in one library per instruction-set
level (libggml-cpu-x64.so ... libggml-cpu-zen4.so) and nothing is registered
until someone calls ggml_backend_load_all*(). llama-cpp-python 0.3.x does not
(abetlen/llama-cpp-python#2069), and ggml's default search path is the
executable's folder, not llama_cpp/lib. Without this, loading a model fails
with "no backends are loaded". ggml scores each variant on this CPU and loads
the best one; it logs which ("load_backend: loaded CPU backend from ...").

A non-portable build registers its CPU backend statically: then the count is
already > 0 and this does nothing. Runs before any app code, so it prints
problems to stderr instead of raising (the app then reports the model load error).
"""

import ctypes
import os
import sys


def _register_ggml_backends() -> None:
    lib_dir = os.path.join(sys._MEIPASS, "llama_cpp", "lib")
    # The names llama_cpp._ctypes_extensions tries, in its order.
    names = {"win32": ("ggml.dll", "libggml.dll"), "darwin": ("libggml.so", "libggml.dylib")}.get(
        sys.platform, ("libggml.so",)
    )
    path = next((os.path.join(lib_dir, n) for n in names if os.path.isfile(os.path.join(lib_dir, n))), None)
    if path is None:
        print(f"lookahead-chat: no ggml library in {lib_dir}", file=sys.stderr)
        return
    if sys.platform == "win32":
        os.add_dll_directory(lib_dir)  # ggml.dll needs ggml-base.dll from the same folder
    # The same path llama_cpp opens later, so both share this one loaded copy (and its backend registry).
    ggml = ctypes.CDLL(path)
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_count.argtypes = []
    if ggml.ggml_backend_reg_count() > 0:
        return
    ggml.ggml_backend_load_all_from_path.restype = None
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(lib_dir.encode("utf-8"))
    if ggml.ggml_backend_reg_count() == 0:
        print(f"lookahead-chat: no ggml backend could be loaded from {lib_dir}", file=sys.stderr)


try:
    _register_ggml_backends()
except (OSError, AttributeError) as exc:  # a missing library or symbol: say so, let the app report the rest
    print(f"lookahead-chat: registering ggml backends failed: {exc}", file=sys.stderr)
