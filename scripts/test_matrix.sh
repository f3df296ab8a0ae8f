#!/usr/bin/env bash
# The test suite on each torch version of the README's matrix, or on the versions given, each in a venv of its own
# (.venv-torch<version>) with torch and remat's dev extras from PyPI (on Linux that torch is the CUDA build, several
# GB; it runs on CPU). Arguments after `--` go to one pytest run per version instead of the fast and slow runs.
#   bash scripts/test_matrix.sh                      # every version of the matrix, the whole suite
#   bash scripts/test_matrix.sh 2.14.1 -- tests/test_backend.py
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MATRIX=(2.11.0 2.12.1 2.13.0 2.14.1)  # the README's "torch versions" table lists the same

versions=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ "${#versions[@]}" -eq 0 ] && versions=("${MATRIX[@]}")

run() {
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
    local status=$?
    [ "$status" -eq 5 ] && { echo "scripts/test_matrix.sh: torch $version: no tests collected for: $*" >&2; return 1; }
    return "$status"
}

failed=()
for version in "${versions[@]}"; do
    venv=".venv-torch$version"
    echo "== torch $version ($venv)"
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv" || { failed+=("$version"); continue; }
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$version" -e ".[dev]"; then
        failed+=("$version"); continue
    fi
    if [ "$#" -gt 0 ]; then
        run "$@" || failed+=("$version")
    else
        { run -m "not slow" && run -m slow; } || failed+=("$version")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "scripts/test_matrix.sh: failed on torch ${failed[*]}" >&2
    exit 1
fi
echo "scripts/test_matrix.sh: passed on torch ${versions[*]}"
