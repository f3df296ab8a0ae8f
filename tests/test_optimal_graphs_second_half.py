"""Optimal against the heuristics on the second half of test_optimal.GRAPHS (200 seeded random graphs in all, split
in two files so that the slow tier's workers share them), under both inner models (check_graph): optimal's plan is
never costlier than a heuristic plan meeting the same budget, its peak never rises as the budget falls, and a bound
it reports is at most every known feasible cost."""

import pytest

from test_optimal import GRAPHS, check_graphs


@pytest.mark.slow
def test_optimal_on_random_graphs():
    assert len(GRAPHS) >= 200
    check_graphs(GRAPHS[100:])
