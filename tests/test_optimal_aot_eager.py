"""Optimal against the heuristics on 200 seeded random graphs under the aot_eager memory model (tests/test_optimal.py's
check_graph): optimal's plan is never costlier than a heuristic plan meeting the same budget, its peak never rises as
the budget falls, and a bound it reports is at most every known feasible cost."""

import pytest

from test_optimal import check_graphs


@pytest.mark.slow
def test_optimal_on_random_graphs():
    check_graphs("aot_eager")
