#!/usr/bin/env bash
# The test suite: the fast subset (-m "not slow") first, then the slow tests. Arguments, when given, are passed to
# one pytest run instead. Exits non-zero when a test fails or when a run collected no test at all.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1

run() {
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
    local status=$?
    if [ "$status" -eq 5 ]; then
        echo "scripts/test.sh: pytest collected no tests for: $* — failing" >&2
        return 1
    fi
    return "$status"
}

if [ "$#" -gt 0 ]; then
    run "$@"
    exit $?
fi
run -m "not slow" || exit 1
run -m slow
