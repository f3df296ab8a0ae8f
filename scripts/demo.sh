#!/usr/bin/env bash
# The main demo: compile a small GPT-style model under a few memory budgets; print plans and measured peaks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
