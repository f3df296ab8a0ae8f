#!/usr/bin/env bash
# The test suite. Exits non-zero when a test fails or when no test ran at all.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests — failing" >&2
    exit 1
fi
exit "$status"
