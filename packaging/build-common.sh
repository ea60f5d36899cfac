# Sourced by build-linux.sh and build-macos.sh (not run by itself): the settings, options and steps both share.
#
# The caller sets NICE first: a command prefix for the long steps ("nice -n 10", or "" for none).
# It gets REPO (and is cd'ed there), PYTHON, BUNDLE_VENV, BUNDLE_PIP_CACHE, LOGS, DIST, VPY,
# REBUILD_LLAMA and SELF_TEST (from its options: --rebuild-llama, --self-test, -h/--help),
# and the functions step, pip_install, ensure_bundle_venv, llama_is_current, install_llama and run_pyinstaller.
# Written for macOS's bash 3.2 too: no mapfile, no empty arrays under set -u.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python3}"
BUNDLE_VENV="${BUNDLE_VENV:-$(dirname "$REPO")/bundle-venv}"
BUNDLE_PIP_CACHE="${BUNDLE_PIP_CACHE:-$(dirname "$REPO")/bundle-pip-cache}"
LOGS="$REPO/build/bundle-logs"
DIST="$REPO/dist"

REBUILD_LLAMA=0
SELF_TEST=0
for arg in "$@"; do
    case "$arg" in
        --rebuild-llama) REBUILD_LLAMA=1 ;;
        --self-test) SELF_TEST=1 ;;
        -h|--help) sed -n '2,/^[^#]/{/^#/p;}' "$0"; exit 0 ;;   # the calling script's header comment
        *) echo "unknown option: $arg" >&2; exit 2 ;;
    esac
done

start=$(date +%s)
mkdir -p "$LOGS" "$DIST"
VPY="$BUNDLE_VENV/bin/python"
pip_install() { ${NICE:-} "$VPY" -m pip install --cache-dir "$BUNDLE_PIP_CACHE" -c packaging/bundle-constraints.txt "$@"; }
step() { echo "== $* ($(( $(date +%s) - start )) s)"; }

# The bundle venv, created on first use, with a current pip.
ensure_bundle_venv() {
    if [[ ! -x "$VPY" ]]; then
        step "creating the bundle venv $BUNDLE_VENV"
        "$PYTHON" -m venv "$BUNDLE_VENV"
    fi
    "$VPY" -m pip install --quiet --cache-dir "$BUNDLE_PIP_CACHE" --upgrade pip
}

# llama.cpp as every build path compiles it: the sdist with our patch applied (packaging/llama_source.py
# prints the folder; it stops the build, saying why, if the patch no longer applies), built without tuning to
# this machine. The wheel is kept in LLAMA_WHEEL_CACHE under a key of the source (version and patch), the
# options, the Python and the machine kind, so that a new bundle venv (CI's, a fresh clone's) installs it in
# seconds; the bundle venv remembers the key it holds, so a changed patch rebuilds it.
LLAMA_WHEEL_CACHE="${LLAMA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lookahead-chat/bundle-wheels}"
LLAMA_KEY_FILE="$BUNDLE_VENV/llama-cpp-source-key"
llama_source() { "$VPY" packaging/llama_source.py "$REPO/build/llama-source"; }
# llama_key CMAKE_ARGS: the wheel's key (the shared options' file is in the source key by content, not by path).
llama_key() {
    printf '%s\n' "$("$VPY" packaging/llama_source.py --key)" "$1" \
        "$("$VPY" -c 'import platform, sys; print(sys.version, platform.system(), platform.machine())')" \
        | "$VPY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])'
}
llama_is_current() { [[ "$(cat "$LLAMA_KEY_FILE" 2>/dev/null)" == "$(llama_key "$1")" ]]; }

# install_llama CMAKE_ARGS: llama-cpp-python into the bundle venv from the cached wheel, built first if there is
# none (or with --rebuild-llama); on a failed build, prints the log's tail and exits 1.
install_llama() {
    local key dir wheel log
    key=$(llama_key "$1")
    dir="$LLAMA_WHEEL_CACHE/$key"
    wheel=$(ls "$dir"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)
    if [[ $REBUILD_LLAMA -eq 1 || -z "$wheel" ]]; then
        local src
        src=$(llama_source)
        log="$LOGS/llama-cpp-python.log"
        step "building llama-cpp-python from $src with $1 (log: $log)"
        rm -rf "$dir" "$dir.partial"
        mkdir -p "$dir.partial"
        if ! CMAKE_ARGS="$1 $("$VPY" packaging/llama_source.py --cmake-args)" CMAKE_BUILD_PARALLEL_LEVEL="$(getconf _NPROCESSORS_ONLN)" \
            ${NICE:-} "$VPY" -m pip wheel --verbose --no-cache-dir --no-deps --wheel-dir "$dir.partial" "$src" \
            >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            echo "llama-cpp-python build FAILED; full log: $log" >&2
            exit 1
        fi
        mv "$dir.partial" "$dir"   # only a finished build is ever found in the cache
        wheel=$(ls "$dir"/llama_cpp_python-*.whl | head -n 1)
    else
        step "llama-cpp-python: the wheel built before ($dir)"
    fi
    "$VPY" -m pip install --quiet --no-deps --force-reinstall "$wheel"
    echo "$key" >"$LLAMA_KEY_FILE"
}

# run_pyinstaller OLD_OUTPUT...: removes the last build's outputs, then runs PyInstaller on
# packaging/lookahead-chat.spec into DIST; on failure, prints the log's tail and exits 1.
run_pyinstaller() {
    step "PyInstaller (log: $LOGS/pyinstaller.log)"
    rm -rf "$@"
    if ! ${NICE:-} "$VPY" -m PyInstaller --noconfirm --clean --log-level WARN \
        --distpath "$DIST" --workpath "$REPO/build/pyinstaller" packaging/lookahead-chat.spec \
        >"$LOGS/pyinstaller.log" 2>&1; then
        tail -n 40 "$LOGS/pyinstaller.log" >&2
        echo "PyInstaller FAILED; full log: $LOGS/pyinstaller.log" >&2
        exit 1
    fi
}
