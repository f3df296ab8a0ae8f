"""Greedy solver: recompute the values that cost least per byte freed, checking every step with the simulator.

Values are ranked by recompute cost per byte, in two orders — plain bytes, and bytes weighted by how much of the
backward pass the value stays live for (a value freed early in backward does little for the peak). Each prefix of a
ranking is a candidate plan; all prefixes are simulated on graphs with up to MAX_STEPS choosable values, an evenly
spaced, budget-independent subset on larger ones. `pick` takes the cheapest that meets the budget.
"""
from __future__ import annotations

from .evaluate import Evaluator, Scored, pick
from .problem import Problem

MAX_STEPS = 96


def rankings(problem: Problem, evaluator: Evaluator) -> list[list[str]]:
    graph = problem.graph
    baseline = evaluator.timeline(problem.resolve(()))
    first_bw = baseline.num_forward
    span = len(baseline.steps) - first_bw or 1
    last_use: dict[str, int] = {}
    for pos in range(first_bw, len(baseline.steps)):
        for inp in graph[baseline.steps[pos]].inputs:
            last_use[inp] = pos - first_bw
    def by_bytes(n: str) -> tuple:
        return (problem.solver_cost(n) / max(graph[n].nbytes, 1), graph[n].index)
    def by_live_bytes(n: str) -> tuple:
        held = graph[n].nbytes * (last_use.get(n, 0) + 1) / span
        return (problem.solver_cost(n) / max(held, 1e-9), graph[n].index)
    choosable = list(problem.choosable)
    return [sorted(choosable, key=by_bytes), sorted(choosable, key=by_live_bytes)]


def prefix_lengths(n: int) -> list[int]:
    if n <= MAX_STEPS:
        return list(range(n + 1))
    return sorted({round(i * n / MAX_STEPS) for i in range(MAX_STEPS + 1)})


def family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    members: list[Scored] = []
    for ranking in rankings(problem, evaluator):
        members.extend(evaluator.score(ranking[:k]) for k in prefix_lengths(len(ranking)))
    return members


def solve(problem: Problem, budget: int | None, evaluator: Evaluator | None = None) -> Scored:
    evaluator = evaluator or Evaluator(problem)
    return pick(family(problem, evaluator), budget)
