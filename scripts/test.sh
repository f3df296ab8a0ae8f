#!/usr/bin/env bash
# The test suite: the fast subset (-m "not slow") first, then the slow tests, each spread over one pytest-xdist
# worker per core (a test file stays on one worker, so its module fixtures are built once; tests/conftest.py starts
# the heaviest files first). Arguments, when given, are passed to one pytest run instead. Exits non-zero when a test
# fails or when a run collected no test at all.
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
workers=$(.venv/bin/python -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")
parallel=(-n "$workers" --dist loadfile --durations=15)  # the log lists each tier's slowest tests
run -m "not slow" "${parallel[@]}" || exit 1
run -m slow "${parallel[@]}"
