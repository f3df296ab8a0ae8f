"""Score candidate choices with the simulator and pick the one a budget allows.

Heuristic solvers propose a *family* of choices that does not depend on the budget; `pick` then takes the cheapest
one whose simulated peak meets the budget (ties: lower peak, then earlier in the family), or the least-peak one when
none does. Because the family is fixed, a lower budget can only narrow the feasible set, so the chosen peak never
rises as the budget falls. A candidate is simulated only when the pick's answer may depend on it (`pick`,
`Scored.floor`). The evaluator is a solver's whole view of the planning: besides the problem and its
simulations it carries how to pick (`Evaluator.pick`: cheapest, or frugal for a graph later graphs of its step follow)
and how long an exact solver may search.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, TypeVar

from . import bounds
from .problem import Problem, Resolved
from .simulate import Timeline, simulate

T = TypeVar("T")


class Scored:
    """One plan an evaluator scored: the values chosen, the sets they resolve to, the recompute cost as the solvers
    weigh it (flops scaled by preferences) — and its simulated peak and saved bytes, simulated when first read.
    `floor` bounds the peak from below without simulating (bounds.floor), so a pick can pass over a plan
    that cannot meet its budget, or cannot be the least peak, unsimulated; `exceeds` asks a costlier bound
    (bounds.backward_floor) where that one does not settle it. `label`: the recipe or partition the
    plan reproduces ("per-block checkpoint"), "" for a solver's own; `bound`: a proved lower bound on the cost of
    any plan meeting the budget (optimal's MILP)."""

    __slots__ = ("chosen", "resolved", "cost", "label", "bound", "_peak", "_saved", "_floor", "_evaluator")

    def __init__(
        self,
        chosen: frozenset[str],
        resolved: Resolved,
        cost: float,
        peak: int | None = None,
        saved: int | None = None,
        label: str = "",
        bound: float | None = None,
        *,
        floor: int = 0,
        evaluator: "Evaluator | None" = None,
    ):
        if peak is None and evaluator is None:
            raise ValueError("Scored: give its peak and saved bytes, or the evaluator that simulates them")
        self.chosen, self.resolved, self.cost, self.label, self.bound = chosen, resolved, cost, label, bound
        self._peak, self._saved, self._floor, self._evaluator = peak, saved, floor, evaluator

    @property
    def peak(self) -> int:
        return self._simulated()[0]

    @property
    def saved(self) -> int:
        return self._simulated()[1]

    @property
    def simulated(self) -> bool:
        """Whether the peak is known (simulated, or given)."""
        return self._peak is not None

    @property
    def floor(self) -> int:
        """The peak once simulated; before, a lower bound on it."""
        return self._floor if self._peak is None else self._peak

    def exceeds(self, limit: int) -> bool:
        """Whether the peak is above `limit`, simulating only where no bound shows it (bounds.floor, then
        bounds.backward_floor)."""
        if self._peak is not None:
            return self._peak > limit
        if self._floor > limit:
            return True
        assert self._evaluator is not None
        return self._evaluator.backward_floor(self.resolved, limit) > limit or self.peak > limit

    def _simulated(self) -> tuple[int, int]:
        """(peak, saved bytes), simulated on the first call."""
        if self._peak is None or self._saved is None:
            assert self._evaluator is not None
            timeline = self._evaluator.timeline(self.resolved)
            self._peak, self._saved = timeline.peak_bytes, timeline.saved_bytes
            assert self._floor <= self._peak, "bounds.floor must bound the simulated peak from below"
            assert self._evaluator.backward_floor_known(self.resolved) <= self._peak, "nor must backward_floor"
        return self._peak, self._saved

    def with_bound(self, bound: float | None) -> "Scored":
        """The same plan with a proved cost bound."""
        other = Scored(self.chosen, self.resolved, self.cost, self._peak, self._saved, self.label, bound)
        other._floor, other._evaluator = self._floor, self._evaluator
        return other

    def __repr__(self) -> str:
        peak = "unsimulated" if self._peak is None else self._peak
        return f"Scored({len(self.chosen)} chosen, cost={self.cost}, peak={peak}, label={self.label!r})"


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
        # Resolved plans by the positions they recompute (Problem.recomputing), shared with the evaluators of
        # problems whose walk facts are this one's (restricted): a variant's walk mostly repeats the unconstrained one.
        self._walks: dict[frozenset[int], Resolved] = {}
        self._floors: dict[Resolved, int] = {}
        # bounds.backward_floor where it was asked for: (the bound found, whether it is the whole bound or one found
        # above a limit)
        self._backward_floors: dict[Resolved, tuple[int, bool]] = {}
        self._costs: dict[Resolved, float] = {}
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

    def backward_floor(self, resolved: Resolved, limit: int) -> int:
        """bounds.backward_floor of the plan, or a lower bound on it above `limit`."""
        known = self._backward_floors.get(resolved)
        if known is None or not (known[1] or known[0] > limit):
            found = bounds.backward_floor(self.problem, resolved, limit)
            known = self._backward_floors[resolved] = (found, found <= limit)
        return known[0]

    def backward_floor_known(self, resolved: Resolved) -> int:
        """The backward floor of the plan found so far (0: not asked for)."""
        return self._backward_floors.get(resolved, (0, True))[0]

    def timeline(self, resolved: Resolved) -> Timeline:
        return self._entry(resolved)[1]

    def _entry(self, resolved: Resolved) -> tuple[float, Timeline]:
        hit = self._memo.get(resolved)
        if hit is None:
            hit = (self._cost(resolved), simulate(self.problem, resolved))
            self._memo[resolved] = hit
        return hit

    def _cost(self, resolved: Resolved) -> float:
        cost = self._costs.get(resolved)
        if cost is None:
            cost = self._costs[resolved] = self.problem.solver_costs(resolved.recomputed)
        return cost

    def score(self, chosen: Iterable[str], label: str = "") -> Scored:
        chosen = frozenset(chosen)
        resolved = self._resolved.get(chosen)
        saved_at = None
        if resolved is None:
            recompute = self.problem.recomputing(chosen)
            resolved = self._walks.get(recompute)
            if resolved is None:
                walk = self.problem.walk(recompute)
                resolved = self._walks[recompute] = self.problem.resolved_of(walk)
                if resolved not in self._costs:  # by position: no name looked up
                    self._costs[resolved] = self.problem.solver_costs_at(walk.recomputed)
                saved_at = walk.saved
            self._resolved[chosen] = resolved
        return self.score_resolved(resolved, chosen, label, saved_at)

    def score_resolved(
        self,
        resolved: Resolved,
        chosen: frozenset[str] = frozenset(),
        label: str = "",
        saved_at: tuple[int, ...] | None = None,
    ) -> Scored:
        """The plan scored: its cost now, its peak and saved bytes simulated when first read (once per resolved plan:
        the evaluator remembers them). `saved_at`: the positions of the values it saves, where known."""
        hit = self._memo.get(resolved)
        if hit is not None:
            cost, timeline = hit
            return Scored(chosen, resolved, cost, timeline.peak_bytes, timeline.saved_bytes, label)
        floor = self._floors.get(resolved)
        if floor is None:
            floor = self._floors[resolved] = bounds.floor(self.problem, resolved, saved_at)
        return Scored(chosen, resolved, self._cost(resolved), label=label, floor=floor, evaluator=self)

    def baseline(self) -> Scored:
        """The inner compiler's own plan (Problem.baseline): what `memory_budget=None` runs."""
        spec = self.problem.baseline
        if spec.saved is None:
            return self.score(spec.chosen, spec.kind if spec.chosen else "")
        resolved = self.problem.resolve_saved(spec.saved)
        return self.score_resolved(resolved, resolved.recomputed & frozenset(self.problem.choosable), spec.kind)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Forget what was simulated, here and in the variants (also on leaving `with Evaluator(...)`). The members
        of a family refer back to their evaluator (Scored simulates when first read), so a family and its evaluator
        form reference cycles that only Python's cyclic collector would free, holding every timeline simulated until
        then: whoever makes an evaluator closes it once its plans are made."""
        for variant in self._variants.values():
            variant.close()
        for memo in (self._memo, self._resolved, self._walks, self._floors, self._backward_floors, self._costs):
            memo.clear()
        self._families.clear()
        self._variants.clear()

    def restricted(self, problem: Problem) -> "Evaluator":
        """An evaluator of `problem` (the same graph under more constraints) sharing this one's simulations."""
        other = Evaluator(problem, self.time_limit, self.frugal)
        other._memo, other._floors, other._costs = self._memo, self._floors, self._costs
        other._backward_floors = self._backward_floors
        if problem.walk_facts == self.problem.walk_facts:
            other._walks = self._walks
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
            return pick_frugal(family, budget, least_peak(family).peak)
        return pick(family, budget)


def pick(family: list[Scored], budget: int | None) -> Scored:
    """The cheapest member meeting `budget` (ties: the lower peak, then the earlier member; None: the first member),
    else the member with the least peak (ties: the cheaper, then the earlier).

    Members are simulated only as far as the answer needs: in order of cost, passing over those whose floor is
    above the budget, up to the first that meets it and those as cheap as it; for the least peak, in order of
    floor, up to the first floor above the least peak found. The answer is the one simulating every member gives."""
    if budget is None:
        return family[0]
    found: int | None = None
    for i in sorted(range(len(family)), key=lambda i: (family[i].cost, i)):
        member = family[i]
        if found is not None and member.cost > family[found].cost:
            break
        if not member.exceeds(budget) and (found is None or member.peak < family[found].peak):
            found = i
    return family[found] if found is not None else least_peak(family)


def least_peak(family: list[Scored]) -> Scored:
    """The member with the least peak (ties: the cheaper, then the earlier), simulating in order of floor only
    the members that may have it."""
    # Start from the least of the members simulated already (a walk's): a member whose bound is above it is passed
    # over unsimulated, the first one included.
    known = [i for i in range(len(family)) if family[i].simulated]
    best = min(known, key=lambda i: (family[i].peak, family[i].cost, i)) if known else None
    for i in sorted(range(len(family)), key=lambda i: (family[i].floor, i)):
        member = family[i]
        if best is not None and member.floor > family[best].peak:
            break
        if best is not None and member.exceeds(family[best].peak):
            continue  # its peak is above the least found
        if best is None or (member.peak, member.cost, i) < (family[best].peak, family[best].cost, best):
            best = i
    assert best is not None, "a family holds at least the inner compiler's own plan"
    return family[best]


def pick_frugal(family: list[Scored], budget: int, least: int) -> Scored:
    """For a graph that later graphs of its step follow: the member meeting `budget` under which the step would peak
    lowest were another graph like it (peaking at `least`) to run while it keeps its saved bytes — max(peak, saved +
    least) — then the cheapest; else the member with the least peak (then the fewest bytes kept)."""
    order = range(len(family))
    feasible = [i for i in order if not family[i].exceeds(budget)]
    if feasible:
        return family[
            min(
                feasible,
                key=lambda i: (max(family[i].peak, family[i].saved + least), family[i].cost, family[i].saved, i),
            )
        ]
    return family[min(order, key=lambda i: (family[i].peak, family[i].saved, family[i].cost, i))]
