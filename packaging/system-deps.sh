#!/usr/bin/env bash
# System libraries Qt needs to start (offscreen or on a screen) on a bare
# Debian/Ubuntu machine, and a compiler toolchain for llama-cpp-python.
# Installs only what is missing; does nothing elsewhere.
set -euo pipefail
command -v apt-get >/dev/null || exit 0
pkgs=(build-essential cmake libgl1 libegl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libdbus-1-3 libglib2.0-0)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}"
fi
