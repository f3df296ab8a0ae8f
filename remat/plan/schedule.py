"""Execution order of a plan. The simulator and the rewrite both use it, so what is simulated is what runs."""
from __future__ import annotations

from ..capture import Role
from .problem import Problem, Resolved


def forward_order(problem: Problem, resolved: Resolved) -> list[str]:
    """Forward values the forward module computes: what the outputs need plus what is saved, in schedule order."""
    graph = problem.graph
    required = set(problem.fw_required)
    stack = [n for n in resolved.saved if n not in required]
    while stack:
        name = stack.pop()
        if name in required:
            continue
        required.add(name)
        stack.extend(i for i in graph[name].inputs if graph[i].role is Role.FORWARD)
    return [n for n in problem.forward if n in required]


def backward_order(problem: Problem, resolved: Resolved) -> list[str]:
    """Backward nodes in schedule order, each recomputed value placed just before its first use.

    A recomputed chain is emitted depth-first, inputs in argument order, immediately ahead of the first backward node
    that reads it, so it is live only from there to its last use.
    """
    graph, recomputed = problem.graph, resolved.recomputed
    order: list[str] = []
    done: set[str] = set()
    for node in problem.backward:
        for root in graph[node].inputs:
            if root not in recomputed or root in done:
                continue
            # iterative post-order walk over the recomputed inputs
            stack: list[tuple[str, bool]] = [(root, False)]
            while stack:
                name, expanded = stack.pop()
                if name in done:
                    continue
                if expanded:
                    done.add(name)
                    order.append(name)
                    continue
                stack.append((name, True))
                for inp in reversed(graph[name].inputs):
                    if inp in recomputed and inp not in done:
                        stack.append((inp, False))
        order.append(node)
    return order
