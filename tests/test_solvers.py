"""Solver properties on seeded random models: optimal is never costlier, budgets are met, plans are deterministic,
and a lower budget never gives a higher peak."""

import functools
import random
import warnings
from pathlib import Path

import pytest
import torch

import remat
from remat.config import RematConfig
from remat.explain import Captured, capture_joints
from remat.pipeline import plan_joint
from remat.plan.evaluate import Evaluator
from remat.plan.solve import make_plan
from remat.plan.solvers import SOLVERS as REGISTRY
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from random_graphs import random_model

SEEDS = range(20)
SOLVERS = ("greedy", "mincut", "optimal")
FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.0)
TIME_LIMIT = 5.0


@functools.lru_cache(maxsize=None)
def joint(seed: int) -> Captured:
    model, inputs = random_model(seed, size=10 + seed % 7)
    (captured,) = capture_joints(model, *inputs)
    return captured


def planned(seed: int, solver: str, budget):
    captured = joint(seed)
    config = RematConfig(memory_budget=budget, solver=solver, solver_time_limit=TIME_LIMIT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # budgets below the least peak warn by design
        return plan_joint(captured.joint, captured.num_fwd_outputs, config)


def plan(seed: int, solver: str, budget):
    return planned(seed, solver, budget).plan


def replan(problem, solver: str, budget, evaluator: Evaluator | None = None):
    """The plan stage alone, on a problem plan_joint built: what plan_joint runs after the budget-independent
    capture, cost and annotate stages. `evaluator`: one shared by several budgets (default: a fresh one, as each
    compile has)."""
    config = RematConfig(memory_budget=budget, solver=solver)
    kind = config.budget_kind()
    value = config.budget_bytes() if kind == "bytes" else config.budget_fraction()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_plan(problem, kind, value, solver, evaluator=evaluator or Evaluator(problem, TIME_LIMIT))


def plans_at(seed: int, solver: str, budgets: list) -> dict:
    """The plan for each budget from one planning pass: the problem plan_joint builds and one evaluator answering
    the budgets in the order given. A solver's families (and optimal's staircase) do not depend on the budget nor
    on the budgets asked before, so each plan is the one a compile at that budget makes afresh; the tests compare
    two passes asking in opposite orders to check it."""
    problem = planned(seed, solver, None).problem
    evaluator = Evaluator(problem, TIME_LIMIT)
    return {budget: replan(problem, solver, budget, evaluator) for budget in budgets}


def byte_budgets(seed: int) -> list[int]:
    """0.3 and 0.0 of the way from the least peak any heuristic reaches to the baseline peak, in bytes."""
    reference = plan(seed, "auto", 0.0)
    least, base = reference.least_peak_bytes, reference.baseline.peak_bytes
    assert least <= base
    return [least + int(0.3 * (base - least)), least]


@pytest.mark.parametrize("seed", SEEDS)
def test_optimal_is_cheapest_and_every_solver_meets_a_reachable_budget(seed):
    budgets = byte_budgets(seed)
    passes = {s: plans_at(seed, s, budgets) for s in SOLVERS}
    # Plans are deterministic: a second pass, asking the budgets in the opposite order, gives the same plans.
    for solver, first in passes.items():
        again = plans_at(seed, solver, budgets[::-1])
        for budget, p in first.items():
            assert again[budget].decisions == p.decisions, (solver, budget)
            assert again[budget] == p, (solver, budget)
    for budget in budgets:
        plans = {s: passes[s][budget] for s in SOLVERS}
        for solver, p in plans.items():
            assert p.budget_bytes == budget, solver
            if budget >= p.least_peak_bytes:
                assert p.feasible and p.peak_bytes <= budget, (solver, budget, p.peak_bytes, p.least_peak_bytes)
            else:
                assert not p.feasible and p.peak_bytes == p.least_peak_bytes, (solver, budget)
        optimal = plans["optimal"]
        # optimal's incumbents include both heuristics' families, so it reaches at least as low a peak ...
        assert optimal.least_peak_bytes <= min(plans[s].least_peak_bytes for s in ("greedy", "mincut"))
        # ... and costs no more than any heuristic plan that meets the same budget.
        for solver in ("greedy", "mincut"):
            if plans[solver].feasible:
                assert optimal.feasible
                assert optimal.recompute_flops <= plans[solver].recompute_flops, (solver, budget)


def budget_sequence(least: int, base: int, seed: int) -> list:
    """Fractions (but 0.0) and byte budgets from twice the baseline peak down to zero, with seeded points between."""
    rng = random.Random(seed)
    between = [rng.randint(least, base) for _ in range(2)]
    return [*(f for f in FRACTIONS if f != 0.0), 2 * base, base, (base + least) // 2, *between, least, least - 1, 0]


@pytest.mark.parametrize("solver", ["auto", "greedy", "mincut"])
def test_lower_budget_never_raises_the_peak(solver):
    """Each seed's budgets are answered by one evaluator (as plans_at); that it answers as a fresh one does, so
    that separate compiles get these peaks too, is checked at fraction 0.0 (against plan_joint's own plan) and at
    one seeded budget of the sequence."""
    for seed in SEEDS:
        first = planned(seed, solver, 0.0)
        zero = first.plan
        evaluator = Evaluator(first.problem, TIME_LIMIT)
        assert replan(first.problem, solver, 0.0, evaluator) == zero, seed
        results = [(zero.budget_bytes, zero.peak_bytes, 0.0)]
        sequence = budget_sequence(zero.least_peak_bytes, zero.baseline.peak_bytes, seed)
        for budget in sequence:
            p = replan(first.problem, solver, budget, evaluator)
            results.append((p.budget_bytes, p.peak_bytes, budget))
        results.sort(key=lambda r: -r[0])
        peaks = [peak for _, peak, _ in results]
        assert peaks == sorted(peaks, reverse=True), (seed, results)
        budget = random.Random(seed).choice(sequence)
        assert replan(first.problem, solver, budget) == replan(first.problem, solver, budget, evaluator), (seed, budget)


def test_optimal_lower_budget_never_raises_the_peak():
    seed = 10
    least = plan(seed, "optimal", 0.0).least_peak_bytes
    below = plan(seed, "optimal", least - 1)
    assert below.peak_bytes == least and not below.feasible  # nothing is reported below the least peak
    assert plan(seed, "optimal", 0).peak_bytes <= below.peak_bytes


# ---- the registry and callable solvers --------------------------------------------------------------------------


def test_every_registered_solver_is_documented_and_plans():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `solver` |"))
    problem = planned(3, "auto", None).problem
    for name, solve in REGISTRY.items():
        assert f'`"{name}"`' in row, name
        chosen = solve(problem, 0, Evaluator(problem, TIME_LIMIT))
        assert chosen.peak == make_plan(problem, "fraction", 0.0, name).least_peak_bytes, name


def recompute_every_choice(problem, budget, evaluator):
    """A solver of its own: recompute every value it may choose, whatever the budget."""
    CALLS.append(budget)
    return evaluator.score(problem.choosable)


CALLS: list = []


def test_a_callable_solver_is_used_and_its_plan_runs_bitwise():
    config = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.1)
    model, batch = GPT(config), make_gpt_batch(config, batch=2)
    torch.manual_seed(0)
    want = torch.autograd.grad(gpt_loss(model, *batch), list(model.parameters()))
    CALLS.clear()
    step = remat.compile(
        lambda idx, targets: gpt_loss(model, idx, targets),
        memory_budget=0.5,
        solver=recompute_every_choice,
        inner="aot_eager",
    )
    torch.manual_seed(0)
    got = torch.autograd.grad(step(*batch), list(model.parameters()))
    plan = remat.last_plan()
    assert plan.solver == "recompute_every_choice" and CALLS[:2] == [0, plan.budget_bytes]
    assert set(plan.problem.choosable) <= plan.resolved.recomputed and plan.recompute_flops > 0
    assert all(torch.equal(g, w) for g, w in zip(got, want))
