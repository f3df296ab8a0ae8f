"""Greedy solver: recompute what costs least per byte freed, checking every step with the simulator.

Two kinds of greedy walks propose plans; each plan along a walk is simulated:
- peak-targeted: simulate, take the saved values live at the simulated peak, recompute the cheapest per byte of
  them, simulate again — until nothing live at the peak can be recomputed. Freeing only what is live at the peak
  spends no recompute on values that do not lower it.
- ranked: all values ranked once by cost per byte (plain, and weighted by how long the value stays live into
  backward); each prefix of a ranking is a plan.
Where a graph has more values than max_steps(graph), a walk moves several values per step, `Problem.walk_values /
max_steps(graph)` of them rounded up (fewer where fewer are live at the peak), so that it simulates at most about
max_steps(graph) plans — fewer as the graph grows, since each simulation costs time linear in its size. The plans
between the values of a small step (at most BETWEEN) are members too, simulated only when a pick needs them: on the
benchmark models (two values per step) the walks then simulate half as many plans and pick the same ones.
walk_values counts the values kept by a save list or by rng="save" as choosable, so the walks of the family's variants
(family.py) take the unconstrained walk's steps, and reuse its simulations, until it recomputes a value they keep.
The walks do not depend on the budget, so `pick` (cheapest plan meeting the budget) gives peaks that never rise as
the budget falls.
"""

from __future__ import annotations

from .evaluate import Evaluator, Scored
from .problem import Problem

MAX_STEPS = 96
MIN_STEPS = 8
NODE_STEPS = 100_000  # about steps × nodes simulated per walk (the benchmark models, about 1000 nodes, take MAX_STEPS)
BETWEEN = 8  # a step of up to this many values also proposes the plans between (each costs a resolve, not a simulation)


def max_steps(problem: Problem) -> int:
    return max(MIN_STEPS, min(MAX_STEPS, NODE_STEPS // max(len(problem.graph.values), 1)))


def step_values(problem: Problem) -> int:
    """How many values a step of a peak walk recomputes (module docstring): walk_values / max_steps, rounded up."""
    return max(1, -(-problem.walk_values // max_steps(problem)))


def ratio(problem: Problem, name: str, held: float | None = None) -> tuple:
    """The order greedy recomputes in: recompute cost per byte freed (`held`: bytes weighted by how long they are
    held instead of the value's bytes), then schedule position."""
    value = problem.graph.by_name[name]  # (called for every value of every ranking: no method call in between)
    return (problem.solver_cost(name) / max(value.nbytes if held is None else held, 1e-9), value.index)


def ranks(problem: Problem, evaluator: Evaluator) -> dict[str, int]:
    """Each choosable value's place in the order greedy recomputes in (`ratio`), found once per problem."""

    def build(problem: Problem, evaluator: Evaluator) -> dict[str, int]:
        ordered = sorted(problem.choosable, key=lambda n: ratio(problem, n))
        return {name: place for place, name in enumerate(ordered)}

    return evaluator.once("greedy ranks", build)


def rankings(problem: Problem, evaluator: Evaluator) -> list[list[str]]:
    graph = problem.graph
    baseline = evaluator.timeline(problem.resolve(()))
    first_bw = baseline.num_forward
    span = len(baseline.steps) - first_bw or 1
    held = {n: graph[n].nbytes * (max(b - first_bw, 0) + 1) / span for n, (_, b) in baseline.saved_spans.items()}
    choosable = list(problem.choosable)
    return [
        list(ranks(problem, evaluator)),
        sorted(choosable, key=lambda n: ratio(problem, n, held.get(n, graph[n].nbytes))),
    ]


def prefix_lengths(n: int, steps: int) -> list[int]:
    if n <= steps:
        return list(range(n + 1))
    return sorted({round(i * n / steps) for i in range(steps + 1)})


def peak_walk(problem: Problem, evaluator: Evaluator, start: frozenset[str] = frozenset()) -> list[Scored]:
    """The peak-targeted walk (module docstring) from recomputing `start` (default: nothing)."""
    place = ranks(problem, evaluator)  # the choosable values, by ratio
    batch = step_values(problem)
    chosen: set[str] = set(start)
    current = evaluator.score(chosen)
    walk = [current]
    while True:
        timeline = evaluator.timeline(current.resolved)
        options = sorted((n for n in timeline.live_at_peak() if n in place and n not in chosen), key=place.__getitem__)
        if not options:
            return walk
        step = options[:batch]
        for name in step[:-1] if len(step) <= BETWEEN else ():
            chosen.add(name)  # the plans between: members too, simulated only where a pick needs one
            walk.append(evaluator.score(chosen))
        chosen.update(step)
        current = evaluator.score(chosen)
        walk.append(current)


def family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    members = peak_walk(problem, evaluator)
    for ranking in rankings(problem, evaluator):
        members.extend(evaluator.score(ranking[:k]) for k in prefix_lengths(len(ranking), max_steps(problem)))
    return members
