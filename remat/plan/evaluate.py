"""Score candidate choices with the simulator and pick the one a budget allows.

Heuristic solvers propose a *family* of choices that does not depend on the budget; `pick` then takes the cheapest
one whose simulated peak meets the budget (ties: lower peak, then earlier in the family), or the least-peak one when
none does. Because the family is fixed, a lower budget can only narrow the feasible set, so the chosen peak never
rises as the budget falls. The evaluator is a solver's whole view of the planning: besides the problem and its
simulations it carries how to pick (`Evaluator.pick`: cheapest, or frugal for a graph later graphs of its step follow)
and how long an exact solver may search.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, Callable, Iterable, TypeVar

from .problem import Problem, Resolved
from .simulate import Lifetimes, Timeline, lifetimes, simulate

T = TypeVar("T")
RECENT = 16  # lifetimes kept for the plans simulated last: a walk reads them again for the plan it moves to


@dataclasses.dataclass(frozen=True)
class Scored:
    chosen: frozenset[str]
    resolved: Resolved
    cost: float  # recompute cost as the solvers weigh it (flops scaled by preferences)
    peak: int
    saved: int
    label: str = ""  # the recipe or partition this plan reproduces ("per-block checkpoint"); "" for a solver's own
    bound: float | None = None  # a proved lower bound on the cost of any plan meeting the budget (optimal's MILP)


class Evaluator:
    """Simulates choices of one problem, remembering results (the same resolved plan is simulated once).
    `time_limit`: seconds an exact solver may search per solve. `frugal`: `pick` takes, of the plans meeting the
    budget, the one leaving most room for a later graph like this one (pick_frugal) rather than the cheapest."""

    def __init__(self, problem: Problem, time_limit: float = 10.0, frugal: bool = False):
        self.problem = problem
        self.time_limit = time_limit
        self.frugal = frugal
        self._memo: dict[Resolved, tuple[float, Timeline]] = {}
        self._resolved: dict[frozenset[str], Resolved] = {}
        self._recent: OrderedDict[Resolved, Lifetimes] = OrderedDict()
        self._families: dict[str, Any] = {}
        self._variants: dict[str, Evaluator] = {}

    def family(self, name: str, build) -> list[Scored]:
        """A solver's budget-independent family of plans, built once per problem."""
        return self.once(name, build)

    def once(self, name: str, build: Callable[[Problem, Evaluator], T]) -> T:
        """What `build(problem, evaluator)` returns, built once per problem: a family, an exact solver's search."""
        if name not in self._families:
            self._families[name] = build(self.problem, self)
        return self._families[name]

    def timeline(self, resolved: Resolved) -> Timeline:
        return self._entry(resolved)[1]

    def lifetimes(self, resolved: Resolved) -> Lifetimes:
        """The plan's live intervals (simulate.lifetimes), kept for the RECENT plans simulated last."""
        life = self._recent.get(resolved)
        if life is None:
            life = lifetimes(self.problem, resolved)
            self._recent[resolved] = life
            if len(self._recent) > RECENT:
                self._recent.popitem(last=False)
        return life

    def _entry(self, resolved: Resolved) -> tuple[float, Timeline]:
        hit = self._memo.get(resolved)
        if hit is None:
            cost = sum(map(self.problem.solver_cost, resolved.recomputed))
            hit = (cost, simulate(self.problem, resolved, self.lifetimes(resolved)))
            self._memo[resolved] = hit
        return hit

    def score(self, chosen: Iterable[str], label: str = "") -> Scored:
        chosen = frozenset(chosen)
        resolved = self._resolved.get(chosen)
        if resolved is None:
            resolved = self._resolved[chosen] = self.problem.resolve(chosen)
        return self.score_resolved(resolved, chosen, label)

    def score_resolved(self, resolved: Resolved, chosen: frozenset[str] = frozenset(), label: str = "") -> Scored:
        cost, timeline = self._entry(resolved)
        return Scored(chosen, resolved, cost, timeline.peak_bytes, timeline.saved_bytes, label)

    def baseline(self) -> Scored:
        """The inner compiler's own plan (Problem.baseline): what `memory_budget=None` runs."""
        spec = self.problem.baseline
        if spec.saved is None:
            return self.score(spec.chosen, spec.kind if spec.chosen else "")
        resolved = self.problem.resolve_saved(spec.saved)
        return self.score_resolved(resolved, resolved.recomputed & frozenset(self.problem.choosable), spec.kind)

    def restricted(self, problem: Problem) -> "Evaluator":
        """An evaluator of `problem` (the same graph under more constraints) sharing this one's simulations."""
        other = Evaluator(problem, self.time_limit, self.frugal)
        other._memo = self._memo
        return other

    def variant(self, name: str, problem: Problem) -> "Evaluator":
        """`restricted(problem)`, made once per `name`: its families are then built once too."""
        if name not in self._variants:
            self._variants[name] = self.restricted(problem)
        return self._variants[name]

    def pick(self, family: list[Scored], budget: int | None) -> Scored:
        """The member of `family` a solver returns for `budget`: `pick`, or under `frugal` `pick_frugal` against
        the family's least peak."""
        if self.frugal and budget is not None:
            return pick_frugal(family, budget, min(s.peak for s in family))
        return pick(family, budget)


def pick(family: list[Scored], budget: int | None) -> Scored:
    """The cheapest member meeting `budget` (None: the first member), else the member with the least peak."""
    if budget is None:
        return family[0]
    order = range(len(family))
    feasible = [i for i in order if family[i].peak <= budget]
    if feasible:
        return family[min(feasible, key=lambda i: (family[i].cost, family[i].peak, i))]
    return family[min(order, key=lambda i: (family[i].peak, family[i].cost, i))]


def pick_frugal(family: list[Scored], budget: int, least: int) -> Scored:
    """For a graph that later graphs of its step follow: the member meeting `budget` under which the step would peak
    lowest were another graph like it (peaking at `least`) to run while it keeps its saved bytes — max(peak, saved +
    least) — then the cheapest; else the member with the least peak (then the fewest bytes kept)."""
    order = range(len(family))
    feasible = [i for i in order if family[i].peak <= budget]
    if feasible:
        return family[
            min(
                feasible,
                key=lambda i: (max(family[i].peak, family[i].saved + least), family[i].cost, family[i].saved, i),
            )
        ]
    return family[min(order, key=lambda i: (family[i].peak, family[i].saved, family[i].cost, i))]
