#!/usr/bin/env bash
# System libraries Qt needs to start (offscreen or on a screen) on a bare
# Debian/Ubuntu machine, and a compiler toolchain for llama-cpp-python.
# With --test, also the tools the tests call (desktop-file-validate).
# Installs only what is missing; does nothing elsewhere.
set -euo pipefail
command -v apt-get >/dev/null || exit 0
pkgs=(build-essential cmake libgl1 libegl1 libfontconfig1 libdbus-1-3 libglib2.0-0)
# Qt's xcb platform plugin (a window on an X11 display): the libraries `ldd libqxcb.so` asks for.
pkgs+=(libxkbcommon0 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1
       libxcb-randr0 libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libxcb-xkb1)
if [[ "${1:-}" == "--test" ]]; then
    pkgs+=(desktop-file-utils)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    echo "installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
