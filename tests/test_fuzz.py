"""Fuzzing: seeded random differentiable graphs under random budgets and solvers.

Each case is one random graph (tests/random_graphs.py with FUZZ_KINDS: chains, diamonds, residuals, reductions,
views, broadcasting, dropout, in-place and multi-output ops) under one random budget. For every case:

- the plan meets its contract: simulated peak <= budget when the budget is reachable, else exactly the least peak;
  a lower budget never gives a higher peak (every solver's plans come from a pool that does not depend on the
  budget); planning the same graph again gives an equal Plan; remat.check_plan passes;
- the forward and backward modules remat's partitioner builds, run as aot_autograd runs them, give a loss and
  gradients (parameters and input) bitwise equal to the uncompiled model's from the same seed, dropout included.

The normal suite runs CASES cases (three budgets per graph). The long run is one command:

    REMAT_FUZZ_CASES=1000 python -m pytest -q -p no:cacheprovider tests/test_fuzz.py

REMAT_FUZZ_SEED shifts the graph seeds to explore graphs the suite never ran. A failure names its graph seed and
budget; `random_model(seed, size, FUZZ_KINDS)` rebuilds the graph.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import warnings

import pytest
import torch
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition

import remat
from remat.backend import Partitioner
from remat.config import RematConfig
from remat.pipeline import plan_joint
from remat.plan.evaluate import Evaluator
from remat.plan.solve import make_plan

from random_graphs import FUZZ_KINDS, random_model

BUDGETS_PER_GRAPH = 3
CASES = int(os.environ.get("REMAT_FUZZ_CASES", "210"))
FIRST_SEED = int(os.environ.get("REMAT_FUZZ_SEED", "0"))
GRAPHS = range(FIRST_SEED, FIRST_SEED + math.ceil(CASES / BUDGETS_PER_GRAPH))


def trace_joint(model: torch.nn.Module, x: torch.Tensor):
    """The joint forward+backward graph of `model(x)` as aot_autograd hands it to a partitioner (primals: the
    parameters, then x, all requiring grad), without dynamo."""
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().requires_grad_() for p in model.parameters()]
    captured = []

    def fn(*args):
        return torch.func.functional_call(model, dict(zip(names, args[:-1])), (args[-1],))

    def keep(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        captured.append((joint, joint_inputs, num_fwd_outputs))
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    with torch.random.fork_rng(devices=[]):
        aot_function(fn, fw_compiler=lambda gm, _: gm, partition_fn=keep)(*params, x)
    (joint,) = captured
    return joint, [*params, x.detach().requires_grad_()]


def run_split(fw, bw, num_fwd_outputs: int, primals: list, seed: int):
    """Run a (forward, backward) pair as aot_autograd's runtime does: the forward returns the user outputs then the
    saved values; the backward takes the saved values (matched by name) and a ones tangent for the loss."""
    torch.manual_seed(seed)
    outs = fw(*[p.detach() for p in primals])
    saved_names = [a.name for a in list(fw.graph.nodes)[-1].args[0]][num_fwd_outputs:]
    env = dict(zip(saved_names, outs[num_fwd_outputs:]))
    loss = outs[0]
    args = [env[p.name] if p.name in env else torch.ones_like(loss) for p in bw.graph.nodes if p.op == "placeholder"]
    return loss, list(bw(*args))


def draw_budget(rng: random.Random, baseline: int):
    """A fraction in [0, 1], or bytes from 0 to 1.2 x the baseline peak (some below the least reachable peak)."""
    if rng.random() < 0.4:
        return round(rng.random(), 2)
    return rng.randint(0, int(1.2 * baseline))


def lower(rng: random.Random, budget, least: int):
    if isinstance(budget, float):
        return round(budget * rng.random(), 2)
    return rng.randint(min(budget, least) // 2, budget)


def plan_of(problem, budget, solver, evaluator):
    config = RematConfig(memory_budget=budget, solver=solver)
    value = config.budget_bytes() if config.budget_kind() == "bytes" else config.budget_fraction()
    return make_plan(problem, config.budget_kind(), value, solver, evaluator=evaluator)


@pytest.mark.parametrize("seed", GRAPHS)
def test_fuzz(seed, monkeypatch):
    rng = random.Random(1_000_003 * seed + 17)
    model, (x,) = random_model(seed, size=rng.randint(6, 14), kinds=FUZZ_KINDS)
    x.requires_grad_()  # gradients reach the input too (some graphs have no parameters)
    torch.manual_seed(seed)
    loss = model(x)
    loss.backward()
    want = [loss.detach()] + [p.grad for p in model.parameters()] + [x.grad]
    (joint, joint_inputs, num_fwd), primals = trace_joint(model, x)
    # The budget-independent stages once per graph, shared by the determinism and monotonicity checks.
    first = plan_joint(joint, num_fwd, RematConfig())
    problem, evaluator, baseline = first.problem, Evaluator(first.problem, 5.0), first.plan.baseline.peak_bytes
    monkeypatch.setattr("remat.backend._plans", [])
    for case in range(BUDGETS_PER_GRAPH):
        budget = draw_budget(rng, baseline)
        solver = rng.choice(("auto", "auto", "greedy", "mincut", "optimal"))
        where = f"graph seed {seed}, case {case}: memory_budget={budget!r}, solver={solver!r}"
        config = RematConfig(memory_budget=budget, solver=solver, debug=True, solver_time_limit=5.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unreachable byte budgets warn by design
            fw, bw = Partitioner(config)(joint, joint_inputs, num_fwd_outputs=num_fwd)
            plan = remat.last_plan()
            remat.check_plan(plan)
            again = plan_of(problem, budget, solver, evaluator)  # another pipeline run on the same graph
            assert again == plan, f"{where}: planning twice gave different plans"
            low = lower(rng, budget, plan.least_peak_bytes)
            lowered = plan_of(problem, low, solver, evaluator)
            assert lowered.peak_bytes <= plan.peak_bytes, f"{where}: lower budget {low!r}"
        if plan.budget_bytes >= plan.least_peak_bytes:
            assert plan.feasible and plan.peak_bytes <= plan.budget_bytes, where
        else:
            assert not plan.feasible and plan.peak_bytes == plan.least_peak_bytes, where
        got_loss, got_grads = run_split(fw, bw, num_fwd, primals, seed)
        got = [got_loss.detach()] + got_grads
        bad = [i for i, (a, b) in enumerate(zip(got, want)) if not torch.equal(a, b)]
        assert not bad and len(got) == len(want), f"{where}: mismatch in outputs {bad} (0 = loss)"


def test_optimal_reports_the_least_peak_it_reached():
    """Found by the long run (graph seed 322): under an unreachable budget the optimal solver's MILP reached a lower
    peak than its least-peak search, and the plan reported the higher figure as the least reachable."""
    rng = random.Random(1_000_003 * 322 + 17)
    model, (x,) = random_model(322, size=rng.randint(6, 14), kinds=FUZZ_KINDS)
    (joint, _, num_fwd), _ = trace_joint(model, x.requires_grad_())
    config = RematConfig(memory_budget=241_319, solver="optimal", solver_time_limit=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        least = plan_joint(joint, num_fwd, config).plan.least_peak_bytes  # 241,319 bytes is reachable now
    config = dataclasses.replace(config, memory_budget=least - 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = plan_joint(joint, num_fwd, config).plan
    assert not plan.feasible and plan.peak_bytes == plan.least_peak_bytes == least
    assert f"({plan.least_peak_bytes} bytes)" in str(caught[-1].message)  # the warning names the same figure
