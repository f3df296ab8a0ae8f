"""compare_solvers on benchmark-like models (GPT-style, Llama-style, MLP) under the aot_eager memory model at fractions
0.0 and 0.3: optimal's row is feasible and every feasible row has gap >= 0 (tests/test_optimal.py's check_compare)."""

import pytest

from test_optimal import MODELS, check_compare


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_compare_solvers_gap_is_never_negative_on_benchmark_models(name):
    check_compare(name, "aot_eager")
