"""Min-cut solver: networkx max-flow on the value graph, weighted by bytes, swept over a recompute price.

Each forward value v becomes an edge v_in → v_out whose capacity is its bytes: cutting it means saving v. An edge
source → v_in priced λ·cost(v) is cut when v is recomputed. Data edges and the edges from what backward reads to the
sink are uncuttable. A minimum cut is then the plan minimising saved bytes + λ·recompute cost. λ = 0 gives the
least-saved-bytes plan; large λ gives the baseline. Sweeping a fixed grid of λ gives a budget-independent family,
from which `pick` takes the cheapest plan whose *simulated peak* meets the budget.
"""
from __future__ import annotations

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov, build_residual_network

from ..capture import Role
from .evaluate import Evaluator, Scored
from .problem import Problem

SOURCE, SINK = "<source>", "<sink>"
PRICE_STEPS = tuple(2.0 ** k for k in range(-10, 11, 2))
LARGE_GRAPH = 5000  # nodes; beyond it a coarser price grid keeps planning near a second
LARGE_PRICE_STEPS = tuple(2.0 ** k for k in range(-8, 9, 4))


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


def _prices(problem: Problem, price: float) -> dict[str, int]:
    return {f"{n}/in": int(round(price * problem.solver_cost(n))) for n in problem.choosable}


def _cut(flow: nx.DiGraph, residual: nx.DiGraph, prices: dict[str, int], problem: Problem) -> frozenset[str]:
    """Minimum cut with the given recompute prices. The residual network is built once and re-priced in place
    (networkx resets its flows on every run), which saves rebuilding it for every price."""
    for node, capacity in prices.items():
        residual[SOURCE][node]["capacity"] = capacity
        residual[node][SOURCE]["capacity"] = 0
    boykov_kolmogorov(flow, SOURCE, SINK, residual=residual, value_only=True)
    source_side = _reachable(residual)
    return frozenset(n for n in problem.choosable if f"{n}/in" not in source_side)


def _reachable(residual: nx.DiGraph) -> set[str]:
    seen, stack = {SOURCE}, [SOURCE]
    while stack:
        u = stack.pop()
        for v, e in residual[u].items():
            if v not in seen and e["flow"] < e["capacity"]:
                seen.add(v)
                stack.append(v)
    return seen


def family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    members = [evaluator.score(())]
    if not problem.choosable:
        return members
    flow = value_graph(problem)
    total_bytes = sum(problem.graph[n].nbytes for n in problem.choosable) or 1
    total_cost = sum(problem.solver_cost(n) for n in problem.choosable) or 1
    scale = total_bytes / total_cost
    steps = LARGE_PRICE_STEPS if len(problem.graph.values) > LARGE_GRAPH else PRICE_STEPS
    prices = [_prices(problem, 0.0)] + [_prices(problem, scale * step) for step in steps]
    # Build the residual network at the highest price, so its stand-in for "infinite" exceeds every cut.
    # (networkx leaves zero-capacity edges out of it: build with at least 1.)
    flow.add_edges_from((SOURCE, node, {"capacity": max(c, 1)}) for node, c in prices[-1].items())
    residual = build_residual_network(flow, "capacity")
    members.extend(evaluator.score(_cut(flow, residual, p, problem)) for p in prices)
    return members

