"""compare_solvers: one capture, one row per solver, optimal's cost no higher than any plan meeting the budget."""

import functools
import warnings

import pytest

import remat.compare as compare
from remat.compare import compare_solvers
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from graphs import MIB, CosMM, cosmm_input

COS = 2 * MIB * 10
MM = 2 * 512**3


@pytest.fixture
def count_captures(monkeypatch):
    calls = []
    real = compare.capture_joints

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compare, "capture_joints", counted)
    return calls


def test_rows_per_solver_on_the_exact_graph(count_captures):
    budget = 5 * MIB + 16
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a solver missing the budget is a column, not a warning
        result = compare_solvers(CosMM(), cosmm_input(), memory_budget=budget)
    assert len(count_captures) == 1
    assert [r.solver for r in result] == ["mincut", "greedy", "optimal"] and len(result) == 3
    optimal = result.row("optimal")
    assert optimal.feasible and optimal.peak_bytes <= budget
    # inductor (the default inner compiler) writes backward's gradients in place over what its loops read last:
    # four recomputed cos and one mm meet 5 MiB (tests/test_optimal.py's exact-graph plans)
    assert optimal.recompute_flops == 4 * COS + MM
    assert optimal.gap == 0.0
    for r in result:
        assert r.seconds > 0 and len(r.plans) == 1
        assert r.recompute_flops == r.plans[0].recompute_flops and r.peak_bytes == r.plans[0].peak_bytes
        assert r.feasible == (r.peak_bytes <= budget)
        assert r.gap == (r.recompute_flops - optimal.recompute_flops) / optimal.recompute_flops
        if r.feasible:
            assert optimal.recompute_flops <= r.recompute_flops
    assert result.budget_bytes == budget


def test_table_and_records():
    result = compare_solvers(CosMM(), cosmm_input(), memory_budget=6 * MIB + 16, solvers=("greedy", "optimal"))
    lines = result.table().splitlines()
    assert lines[0].split() == ["solver", "recompute", "peak", "saved", "feasible", "planning", "gap", "to", "optimal"]
    assert lines[1].startswith("greedy") and lines[2].startswith("optimal") and lines[2].endswith("+0.0%")
    assert lines[-1] == "budget 6.0 MiB"
    records = result.to_records()
    assert [r["solver"] for r in records] == ["greedy", "optimal"] and "plans" not in records[0]


def test_without_optimal_there_is_no_gap():
    result = compare_solvers(CosMM(), cosmm_input(), memory_budget=8 * MIB + 16, solvers=("greedy",))
    assert result[0].gap is None and result.table().splitlines()[1].endswith("-")


def test_fraction_budget_is_the_same_bytes_for_every_solver(count_captures):
    config = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32)
    idx, targets = make_gpt_batch(config, 2)
    result = compare_solvers(functools.partial(gpt_loss, GPT(config)), idx, targets, memory_budget=0.3)
    assert len(count_captures) == 1
    budgets = {p.budget_bytes for r in result for p in r.plans}
    assert budgets == {result.budget_bytes}
    optimal = result.row("optimal")
    assert optimal.feasible
    assert all(optimal.recompute_flops <= r.recompute_flops for r in result if r.feasible)


def test_solver_field_is_refused():
    with pytest.raises(TypeError, match="solvers="):
        compare_solvers(CosMM(), cosmm_input(), memory_budget=0.5, solver="greedy")
