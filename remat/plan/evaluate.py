"""Score candidate choices with the simulator and pick the one a budget allows.

Heuristic solvers propose a *family* of choices that does not depend on the budget; `pick` then takes the cheapest
one whose simulated peak meets the budget (ties: lower peak, then earlier in the family), or the least-peak one when
none does. Because the family is fixed, a lower budget can only narrow the feasible set, so the chosen peak never
rises as the budget falls.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from .problem import Problem, Resolved
from .simulate import Timeline, simulate


@dataclasses.dataclass(frozen=True)
class Scored:
    chosen: frozenset[str]
    resolved: Resolved
    cost: float  # recompute cost as the solvers weigh it (flops scaled by preferences)
    peak: int
    saved: int


class Evaluator:
    """Simulates choices of one problem, remembering results (the same resolved plan is simulated once)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self._memo: dict[Resolved, tuple[float, Timeline]] = {}
        self._families: dict[str, list[Scored]] = {}

    def family(self, name: str, build) -> list[Scored]:
        """A solver's budget-independent family of plans, built once per problem."""
        if name not in self._families:
            self._families[name] = build(self.problem, self)
        return self._families[name]

    def timeline(self, resolved: Resolved) -> Timeline:
        return self._entry(resolved)[1]

    def _entry(self, resolved: Resolved) -> tuple[float, Timeline]:
        hit = self._memo.get(resolved)
        if hit is None:
            cost = sum(self.problem.solver_cost(n) for n in resolved.recomputed)
            hit = (cost, simulate(self.problem, resolved))
            self._memo[resolved] = hit
        return hit

    def score(self, chosen: Iterable[str]) -> Scored:
        chosen = frozenset(chosen)
        resolved = self.problem.resolve(chosen)
        cost, timeline = self._entry(resolved)
        return Scored(chosen, resolved, cost, timeline.peak_bytes, timeline.saved_bytes)


def pick(family: list[Scored], budget: int | None) -> Scored:
    """The cheapest member meeting `budget` (None: the first member), else the member with the least peak."""
    if budget is None:
        return family[0]
    order = range(len(family))
    feasible = [i for i in order if family[i].peak <= budget]
    if feasible:
        return family[min(feasible, key=lambda i: (family[i].cost, family[i].peak, i))]
    return family[min(order, key=lambda i: (family[i].peak, family[i].cost, i))]
