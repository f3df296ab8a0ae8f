"""mincut's cuts with scipy's compiled max-flow (plan/maxflow.py) are networkx's cuts: the same least source side."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import solver_misses  # noqa: E402 (benchmarks/ is not a package: imported from its folder)
from remat.plan import maxflow, mincut  # noqa: E402
from remat.plan.maxflow import Edges  # noqa: E402
from remat.plan.mincut import SINK, SOURCE, Cutter  # noqa: E402


def test_least_source_side_of_a_small_network():
    # s=0 → a=1 (4), s → b=2 (2), a → t=3 (2), b → t (3), a → b (1): the maximum flow is 5, and s → a keeps a
    # unit spare, so the least minimum cut is {s → b, a → t, a → b}: source side {s, a}
    edges = Edges(4, [0, 0, 1, 2, 1], [1, 2, 3, 3, 2])
    side = edges.source_side(np.array([4, 2, 2, 3, 1], dtype=np.int64), 100, 0, 3)
    assert side is not None and side.tolist() == [True, True, False, False]
    # with s → a at 3 every path out of s is full: the least source side is {s}
    side = edges.source_side(np.array([3, 2, 2, 3, 1], dtype=np.int64), 100, 0, 3)
    assert side is not None and side.tolist() == [True, False, False, False]
    # a tie: both cuts of one unit each; the least source side holds the source alone
    chain = Edges(3, [0, 1], [1, 2])
    assert chain.source_side(np.array([1, 1], dtype=np.int64), 100, 0, 2).tolist() == [True, False, False]


def test_capacities_that_do_not_fit_or_a_bound_below_the_flow_give_none():
    chain = Edges(3, [0, 1], [1, 2])
    assert chain.source_side(np.array([5, 5], dtype=np.int64), maxflow.INT32_MAX + 1, 0, 2) is None
    # `bound` is not above the maximum flow: no answer (the caller cuts with networkx)
    assert chain.source_side(np.array([5, 5], dtype=np.int64), 5, 0, 2) is None
    with pytest.raises(ValueError, match="2-cycles"):
        Edges(2, [0, 1], [1, 0])
    with pytest.raises(ValueError, match="repeated"):
        Edges(2, [0, 0], [1, 1])


def _both(cutter: Cutter, price: float, saved: dict, held: dict):
    capacities, bound = cutter.capacities(price, saved, held)
    return cutter._scipy_cut(capacities, bound), cutter._networkx_cut(capacities)


def test_scipy_cuts_are_networkx_cuts_on_models_and_random_graphs():
    compared = fell_back = 0
    for _, model, inputs in solver_misses.graphs(6):
        problem = solver_misses.problem_of(model, inputs, "aot_eager")
        if not problem.choosable:
            continue
        grid = mincut.prices(problem)
        cutter = Cutter(problem, grid[-1])
        choosable = list(problem.choosable)
        # the sweep's weights, then peak rounds' weights on every third value (saving edges) and every fifth (held)
        for weights in ({}, {n: mincut.PEAK_WEIGHT**2 for n in choosable[::3]}):
            held = {n: mincut.PEAK_WEIGHT for n in choosable[::5]} if weights else {}
            for price in grid:
                fast, slow = _both(cutter, price, weights, held)
                if fast is None:
                    fell_back += 1
                    continue
                assert fast == slow, (price, weights)
                assert SOURCE in fast and SINK not in fast
                # cut's own arrays give the cut these capacities give
                assert cutter.cut(price, weights, held) == frozenset(n for n in choosable if f"{n}/in" not in slow)
                compared += 1
    assert compared >= 150, (compared, fell_back)


def test_a_cut_that_does_not_fit_int32_is_cut_with_networkx():
    _, model, inputs = next(iter(solver_misses.graphs(0)))
    problem = solver_misses.problem_of(model, inputs, "aot_eager")
    cutter = Cutter(problem, mincut.prices(problem)[-1])
    heavy = {n: mincut.PEAK_WEIGHT**mincut.PEAK_ROUNDS for n in cutter.saving}  # bytes × 65536: beyond int32
    fast, slow = _both(cutter, 1.0, heavy, {})
    assert fast is None and slow
    assert cutter.cut(1.0, heavy, {}) == frozenset(n for n in problem.choosable if f"{n}/in" not in slow)
