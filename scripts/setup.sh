#!/usr/bin/env bash
# Creates .venv (reusing a torch already installed on the machine) and installs remat with its dev extras.
# torch==2.13.0 is installed only when no torch is importable: a bare `pip install torch` would pull a multi-GB
# CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv --system-site-packages .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    "${PIP[@]}" "torch==2.13.0"
fi
"${PIP[@]}" -e ".[dev]"
