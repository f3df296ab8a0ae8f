"""The optimal solver against the simulator and the heuristics.

- The MILP's memory rows (plan/liveness.py) relax the simulation under the eager inner compilers: at any plan the
  rows' peak is at most the simulated peak, and they are the simulation's own at the plan that saves everything.
- On seeded random graphs under both inner models (inductor, aot_eager), at budgets from the baseline peak down to
  zero: optimal's plan is never costlier than a heuristic plan meeting the same budget, its simulated peak never
  rises as the budget falls, and a bound it reports is at most the cost of every plan it knows meeting the budget
  (`check_graph`: here on a few graphs; on 200, `check_graphs`).
- compare_solvers on benchmark-like models (GPT-style, Llama-style, MLP) shows gap >= 0 on every feasible row
  (`check_compare`).
The 200 graphs run in tests/test_optimal_graphs_{first,second}_half.py (both inner models on each graph, traced
once) and the models in tests/test_compare_models_{aot_eager,inductor}.py: several files, so that the slow tier's
workers share them.
"""

from __future__ import annotations

import functools
import random
import time
import warnings

import numpy as np
import pytest

import remat
from remat.compare import compare_solvers
from remat.config import RematConfig
from remat.pipeline import plan_joint
from remat.plan import optimal
from remat.plan.evaluate import Evaluator
from remat.plan.liveness import liveness
from remat.plan.simulate import simulate
from remat.plan.solvers import SOLVERS
from remat.zoo import GPT, MLP, GPTConfig, Llama, gpt_loss, make_gpt_batch, make_mlp_batch, mlp_loss

from graphs import MIB, CosMM, cosmm_input
from random_graphs import random_model
from test_fuzz import trace_joint

GRAPHS = range(200)
INNERS = ("aot_eager", "inductor")
HEURISTICS = ("auto", "greedy", "mincut")
TIME_LIMIT = 5.0
COS = 2 * MIB * 10  # recompute cost of one 512x512 cos (tests/test_plan_exact.py)
MM = 2 * 512**3


@functools.lru_cache(maxsize=None)
def joint(seed: int):
    model, (x,) = random_model(seed, size=4 + seed % 5)
    (graph, _, num_fwd), _ = trace_joint(model, x.requires_grad_())
    return graph, num_fwd


def problem_of(seed: int, inner: str):
    graph, num_fwd = joint(seed)
    return plan_joint(graph, num_fwd, RematConfig(memory_budget=None, inner=inner)).problem


def rows_at(model: optimal.Model, problem, chosen) -> np.ndarray:
    """The memory rows' values at the plan that recomputes `chosen`."""
    resolved = problem.resolve(chosen)
    k = len(model.names)
    x = np.zeros(2 * k)
    for i, name in enumerate(model.names):
        x[i] = name in resolved.saved
        x[k + i] = name in resolved.recomputed
    return model.base + model.memory @ x


@pytest.mark.parametrize("seed", range(10))
def test_rows_relax_the_simulation_and_are_exact_when_everything_is_saved(seed):
    problem = problem_of(seed, "aot_eager")
    model = optimal.build(problem)
    assert model.bounds
    rng = random.Random(seed)
    for trial in range(20):
        chosen = [n for n in problem.choosable if rng.random() < trial / 20]
        assert rows_at(model, problem, chosen).max(initial=0) <= simulate(problem, problem.resolve(chosen)).peak_bytes
    # Saving everything: each row is the simulated live bytes at its step.
    timeline = simulate(problem, problem.resolve(()))
    at = {}
    for p, name in enumerate(timeline.steps):
        if p < timeline.num_forward or name in problem.backward:
            at.setdefault(name, timeline.live[p])
    rows = liveness(problem).rows
    assert list(rows_at(model, problem, ())) == [at[name] for name in rows]


def test_rows_follow_the_inner_model():
    """Under inductor the rows count what inductor writes out: a forward value computed inside the loops reading it
    is live at no step, so some row differs from the eager rows; and no bound is claimed."""
    differs = 0
    for seed in range(5):
        eager, fused = problem_of(seed, "aot_eager"), problem_of(seed, "inductor")
        assert not optimal.build(fused).bounds
        differs += liveness(eager).base != liveness(fused).base
    assert differs


@pytest.mark.parametrize("inner", INNERS)
def test_gap_on_the_exact_graph(inner):
    """CosMM's optimal plans (tests/test_plan_exact.py). Under aot_eager the MILP's rows relax the simulation, so
    its bound is a true lower bound: the gap is in [0, 1) (each cos's derivative, -sin, may be computed in the
    forward and saved as torch's min-cut partition does; the rows count what that holds live only through the
    factor, so the bound is no longer tight); under inductor no bound is claimed. Under inductor backward's loops
    write their gradients in place over the values they read last, so one cos fewer is recomputed at each budget."""
    fewer = 1 if inner == "inductor" else 0
    for budget, cost in ((5 * MIB + 16, (5 - fewer) * COS + MM), (6 * MIB + 16, (5 - fewer) * COS)):
        plan = remat.explain(CosMM(), cosmm_input(), memory_budget=budget, solver="optimal", inner=inner)
        assert plan.feasible and plan.recompute_flops == cost
        if inner == "inductor":
            assert plan.gap is None
        else:
            assert plan.gap is not None and 0 <= plan.gap < 1


def check_graph(seed: int, inner: str) -> tuple[float, list[float]]:
    """Optimal against the heuristics on one graph at budgets from the baseline peak down: (seconds optimal took,
    the gaps of its plans meeting a budget with a bound)."""
    problem = problem_of(seed, inner)
    evaluator = Evaluator(problem, TIME_LIMIT)
    base, least = evaluator.baseline().peak, SOLVERS["auto"](problem, 0, evaluator).peak
    rng = random.Random(seed)
    budgets = sorted(
        {
            2 * base,
            base,
            least + (base - least) // 2,
            least + (base - least) // 5,
            least,
            least - 1,
            0,
            *(rng.randint(least, base) for _ in range(3)),
        },
        reverse=True,
    )
    spent, gaps, last = 0.0, [], None
    for budget in budgets:
        start = time.perf_counter()
        best = optimal.solve(problem, budget, evaluator)
        spent += time.perf_counter() - start
        where = f"graph seed {seed}, inner {inner}, budget {budget}"
        for name in HEURISTICS:
            other = SOLVERS[name](problem, budget, evaluator)
            if other.peak <= budget:
                assert best.peak <= budget and best.cost <= other.cost, (where, name, best, other)
                assert best.bound is None or best.bound <= other.cost + 1e-9 * max(other.cost, 1), (where, name)
        if last is not None:
            assert best.peak <= last, (where, best.peak, last)
        last = best.peak
        if best.bound is not None:
            assert best.peak <= budget and best.bound <= best.cost + 1e-9 * max(best.cost, 1), where
            gaps.append((best.cost - best.bound) / best.cost if best.cost else 0.0)
    return spent, gaps


def test_optimal_on_random_graphs_quick():
    for seed in (0, 7):
        for inner in INNERS:
            check_graph(seed, inner)


def check_graphs(seeds: range) -> None:
    """check_graph on the graphs of `seeds` under every inner model; prints the numbers the solver's notes quote."""
    times, gaps = [], []
    for seed in seeds:
        for inner in INNERS:
            spent, found = check_graph(seed, inner)
            times.append(spent)
            gaps += found
    print(
        f"\ngraphs {seeds.start}..{seeds.stop - 1} x {len(INNERS)} inner models: optimal's planning max "
        f"{max(times):.2f} s, total {sum(times):.1f} s; {len(gaps)} bounded plans, gap max {max(gaps, default=0):.3f}, "
        f"mean {sum(gaps) / max(len(gaps), 1):.3f}"
    )


def test_a_fresh_evaluator_gives_the_same_plans():
    """The staircase does not depend on the budgets asked before: planning each budget afresh gives the same plans,
    so the monotone peaks hold across separate compiles too."""
    problem = problem_of(3, "aot_eager")
    shared = Evaluator(problem, TIME_LIMIT)
    least, base = optimal.solve(problem, 0, shared).peak, shared.baseline().peak
    for budget in (least, (base + least) // 2, base):  # the shared one has traced deeper each time
        assert (
            optimal.solve(problem, budget, Evaluator(problem, TIME_LIMIT)).chosen
            == optimal.solve(problem, budget, shared).chosen
        )


MODELS = ("gpt", "llama", "mlp")


def models():
    config = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32)
    batch = make_gpt_batch(config, 2)
    llama = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.0)
    return {
        "gpt": (functools.partial(gpt_loss, GPT(config)), batch),
        "llama": (functools.partial(gpt_loss, Llama(llama)), batch),
        "mlp": (functools.partial(mlp_loss, MLP(256, 6)), (make_mlp_batch(256, 32),)),
    }


def check_compare(name: str, inner: str) -> None:
    """compare_solvers on model `name` at fractions 0.0 and 0.3: optimal's row is feasible, and every feasible row
    has a gap >= 0."""
    fn, inputs = models()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fraction in (0.0, 0.3):
            result = compare_solvers(fn, *inputs, memory_budget=fraction, inner=inner, solver_time_limit=TIME_LIMIT)
            assert result.row("optimal").feasible
            for row in result:
                if row.feasible:
                    assert row.gap is not None and row.gap >= 0, (name, inner, fraction, row)
            print(f"\n{name} {inner} {fraction}\n{result.table()}")
