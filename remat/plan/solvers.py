"""The solver registry: every solver by name, behind one signature.

A solver is a callable `(problem, budget, evaluator) -> Scored`: the plan it picks for `budget` (bytes; None: no
budget, the inner compiler's own plan), scored by `evaluator` (evaluate.py: simulated peak, saved bytes, recompute
cost). Asked for a budget no plan meets, a solver returns the least-peak plan it finds: `make_plan` asks for 0 bytes
to learn the least peak a fraction is resolved against. Solvers choose among their proposals with `evaluator.pick`,
so a step's frugal graphs and the exact solver's time limit reach every one of them.

`SOLVERS` is the one table of them, read by config validation, `compare_solvers`, `make_plan` and the README's option
table (tests/test_solvers.py checks it); `solver=` also takes a callable with the same signature.
"""

from __future__ import annotations

import types
from typing import Callable, Mapping, Optional

from . import optimal
from .evaluate import Evaluator, Scored
from .family import heuristic_family
from .problem import Problem

Solver = Callable[[Problem, Optional[int], Evaluator], Scored]


def solve_auto(problem: Problem, budget: int | None, evaluator: Evaluator) -> Scored:
    """The cheapest plan of greedy's family and mincut's price sweep (its peak-aware rounds and repair walks are left
    to the mincut solver: greedy's plans reach the peaks they aim at, in less planning time)."""
    return evaluator.pick(heuristic_family(evaluator, ("greedy", "mincut-sweep")), budget)


def solve_mincut(problem: Problem, budget: int | None, evaluator: Evaluator) -> Scored:
    """The cheapest plan of mincut's family (mincut.py)."""
    return evaluator.pick(heuristic_family(evaluator, ("mincut",)), budget)


def solve_greedy(problem: Problem, budget: int | None, evaluator: Evaluator) -> Scored:
    """The cheapest plan of greedy's family (greedy.py)."""
    return evaluator.pick(heuristic_family(evaluator, ("greedy",)), budget)


DEFAULT = "auto"
SOLVERS: Mapping[str, Solver] = types.MappingProxyType(
    {
        "auto": solve_auto,
        "mincut": solve_mincut,
        "greedy": solve_greedy,
        "optimal": optimal.solve,
    }
)


def named(solver: str | Solver) -> tuple[str, Solver]:
    """(the name a plan reports, the function) for a registered name or a callable solver."""
    if isinstance(solver, str):
        return solver, SOLVERS[solver]
    return getattr(solver, "__name__", type(solver).__name__), solver
