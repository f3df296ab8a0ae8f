#!/usr/bin/env bash
# Static checks, run before the tests (.ci/run): ruff's lint rules over the repository (notebook sources included)
# and mypy over the package, both configured in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

lint() {
    .venv/bin/python -m ruff check --no-cache .
}

typecheck() {
    .venv/bin/python -m mypy  # files and options: [tool.mypy]
}

# ruff's formatter ([tool.ruff.format]): the repository is kept formatted.
format_check() {
    .venv/bin/python -m ruff format --check --no-cache .
}

lint
format_check
typecheck
