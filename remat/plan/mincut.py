"""Min-cut solver: networkx max-flow on the value graph, weighted by bytes, swept over a recompute price.

Each forward value v becomes an edge v_in → v_out whose capacity is its bytes: cutting it means saving v. An edge
source → v_in priced λ·cost(v) is cut when v is recomputed. Data edges and the edges from what backward reads to the
sink are uncuttable. A minimum cut is then the plan minimising saved bytes + λ·recompute cost. λ = 0 gives the
least-saved-bytes plan; large λ gives the baseline. Sweeping a fixed grid of λ gives a budget-independent family,
from which `pick` takes the cheapest plan whose *simulated peak* meets the budget.
"""
from __future__ import annotations

import networkx as nx

from ..capture import Role
from .evaluate import Evaluator, Scored, pick
from .problem import Problem

SOURCE, SINK = "<source>", "<sink>"
PRICE_STEPS = tuple(2.0 ** k for k in range(-10, 11, 2))


def value_graph(problem: Problem) -> nx.DiGraph:
    """The flow graph without recompute prices (edges without 'capacity' are uncuttable)."""
    graph, c = problem.graph, problem.constraints
    flow = nx.DiGraph()
    flow.add_node(SOURCE)
    flow.add_node(SINK)
    for name in problem.candidates:
        value = graph[name]
        if name in c.must_recompute or not value.is_tensor:
            flow.add_edge(f"{name}/in", f"{name}/out")  # cannot be saved
        else:
            flow.add_edge(f"{name}/in", f"{name}/out", capacity=value.nbytes)
        if name in c.must_save:
            flow.add_edge(SOURCE, f"{name}/in")  # cannot be recomputed
        for inp in value.inputs:
            if graph[inp].role is Role.FORWARD:
                flow.add_edge(f"{inp}/out", f"{name}/in")
    for name in problem.needed:
        flow.add_edge(f"{name}/out", SINK)
    return flow


def _cut(problem: Problem, base: nx.DiGraph, price: float) -> frozenset[str]:
    flow = base.copy()
    for name in problem.choosable:
        flow.add_edge(SOURCE, f"{name}/in", capacity=int(round(price * problem.solver_cost(name))))
    _, (source_side, _) = nx.minimum_cut(flow, SOURCE, SINK)
    return frozenset(n for n in problem.choosable if f"{n}/in" not in source_side)


def family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    members = [evaluator.score(())]
    if not problem.choosable:
        return members
    base = value_graph(problem)
    total_bytes = sum(problem.graph[n].nbytes for n in problem.choosable) or 1
    total_cost = sum(problem.solver_cost(n) for n in problem.choosable) or 1
    scale = total_bytes / total_cost
    members.append(evaluator.score(_cut(problem, base, 0.0)))
    members.extend(evaluator.score(_cut(problem, base, scale * step)) for step in PRICE_STEPS)
    return members


def solve(problem: Problem, budget: int | None, evaluator: Evaluator | None = None) -> Scored:
    evaluator = evaluator or Evaluator(problem)
    return pick(family(problem, evaluator), budget)
