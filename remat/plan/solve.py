"""(problem, budget, solver) → Plan. The one entry point the backend and `explain` use; the solvers are in the
registry (solvers.py)."""

from __future__ import annotations

import warnings
from typing import Callable

import sympy

from ..annotate import Action
from ..capture import Role
from ..units import fmt_bytes, fmt_flops, short_op
from .decisions import rng_state_decision, transfer_decision
from .evaluate import Evaluator, Scored
from .plan import Baseline, Decision, Plan
from .problem import Problem
from .solvers import DEFAULT, Solver, named
from .schedule import forward_order
from .symbolic import symbolic_memory


class BudgetError(ValueError):
    """Raised with strict=True when the memory budget cannot be met; `least`: the least peak reachable (bytes)."""

    def __init__(self, message: str, least: int | None = None):
        super().__init__(message)
        self.least = least


def resolve_budget(kind: str, value: float | int | None, least: int, baseline: int) -> int | None:
    if kind == "none" or value is None:
        return None
    if kind == "fraction":
        return int(least + value * (baseline - least))
    return int(value)


def make_plan(
    problem: Problem,
    budget_kind: str,
    budget_value: float | int | None,
    solver: str | Solver = DEFAULT,
    strict: bool = False,
    evaluator: Evaluator | None = None,
) -> Plan:
    """Plan one joint graph. `budget_kind` is "none", "bytes" or "fraction" (see RematConfig.memory_budget);
    `solver` a name in solvers.SOLVERS or a callable with their signature. The evaluator carries the solver's time
    limit and whether to pick frugally (evaluate.Evaluator; the default: 10 s, the cheapest plan, made and closed
    here)."""
    if evaluator is None:
        with Evaluator(problem) as own:
            return make_plan(problem, budget_kind, budget_value, solver, strict, own)
    name, solve = named(solver)
    base = evaluator.baseline()
    baseline = Baseline(
        base.saved, base.peak, sum(problem.costs[n] for n in base.resolved.recomputed), problem.baseline.kind
    )
    if budget_kind == "none":
        return _plan(problem, evaluator, base, baseline, None, None, "baseline", None)
    lowest: Scored | None = None
    if budget_kind == "fraction" and budget_value != 1:  # fraction 1.0 is the baseline's peak, whatever the least
        lowest = solve(problem, 0, evaluator)  # no plan peaks under 0 bytes: the least-peak plan the solver finds
    budget = resolve_budget(budget_kind, budget_value, lowest.peak if lowest else 0, base.peak)
    assert budget is not None  # budget_kind is "bytes" or "fraction" here, with a value (RematConfig checks it)
    chosen = solve(problem, budget, evaluator)
    least: int | Callable[[], int]
    if lowest is None and chosen.peak <= budget:
        # A byte budget (or fraction 1.0) met: the least peak is not needed to plan, and searching for it takes a
        # third or more of the planning time. It is searched for when first read, with an evaluator of its own
        # (this one's simulations are not kept alive with the plan).
        least = _least_peak_later(problem, solve, evaluator, chosen.peak)
    else:
        lowest = lowest or solve(problem, 0, evaluator)
        least = min(lowest.peak, chosen.peak)  # the run for this budget may reach below the least-peak run
    if chosen.peak > budget:
        assert isinstance(least, int)
        message = (
            f"memory_budget: {fmt_bytes(budget)} cannot be met for this graph; the least peak solver={name!r} can "
            f"reach is {fmt_bytes(least)} ({least} bytes)"
        )
        if strict:
            raise BudgetError(f"{message}; strict=True: raise the budget to at least {least} bytes", least)
        warnings.warn(f"{message}; using the plan with that peak", stacklevel=2)
    return _plan(problem, evaluator, chosen, baseline, budget, least, name, _gap(chosen))


def _least_peak_later(problem: Problem, solve: Solver, like: Evaluator, reached: int) -> Callable[[], int]:
    """What searches, when called (Plan.least_peak_bytes), for the least peak `solve` reaches for `problem`: with an
    evaluator like `like`, and no higher than `reached`, the peak of a plan already made."""
    time_limit, frugal = like.time_limit, like.frugal

    def least() -> int:
        with Evaluator(problem, time_limit, frugal) as evaluator:
            return min(solve(problem, 0, evaluator).peak, reached)

    return least


def _gap(chosen: Scored) -> float | None:
    """(cost - lower bound) / cost when the solver proved a bound on the cost of plans meeting the budget."""
    if chosen.bound is None:
        return None
    return max(0.0, (chosen.cost - chosen.bound) / chosen.cost) if chosen.cost > 0 else 0.0


def _plan(problem, evaluator, chosen: Scored, baseline, budget, least, solver, gap) -> Plan:
    graph, c = problem.graph, problem.constraints
    resolved = chosen.resolved
    timeline = evaluator.timeline(resolved)
    decisions = []
    # A saved view keeps its base: the decision is the base's (torch's min-cut partitioner saves such views).
    saved = problem.saved_owners(resolved)
    for name in sorted(saved | (resolved.recomputed - saved), key=lambda n: graph[n].index):
        v = graph[name]
        if not (v.is_tensor or v.is_multi) or graph[v.storage].role is not Role.FORWARD:
            continue  # symbolic sizes and views of inputs are not activations
        producer = v.inputs[0] if v.op == "getitem" and v.inputs else None
        source_op = graph[producer].op if producer else ""
        # What recomputing it takes: a getitem needs its tuple producer re-run.
        what = fmt_flops(problem.costs[name] + (problem.costs[producer] if producer else 0))
        what += f" ({short_op(source_op)})" if producer else ""
        kept = None
        if name in saved:
            action = Action.SAVE
            if name in c.must_save:
                reason = c.must_save[name]
            elif budget is None:
                reason = f"no memory_budget: saved as the {problem.baseline.kind} does"
            elif chosen.label:
                reason = f"saved ({chosen.label}): recomputing would cost {what}"
            else:
                reason = f"saved: recomputing would cost {what}; the budget is met without it"
            action, kept, reason = transfer_decision(problem, resolved, name, reason)
        else:
            action = Action.RECOMPUTE
            if name in c.must_recompute:
                reason = c.must_recompute[name]
            else:
                reason = f"recomputed ({chosen.label or solver}): {what} frees {fmt_bytes(v.nbytes)}"
            if name in c.replay or producer in c.replay:
                reason += "; replayed from the RNG state saved before it"
        decisions.append(
            Decision(
                name,
                v.op,
                v.module_path,
                v.shape,
                v.dtype,
                v.nbytes,
                problem.costs[name],
                action,
                reason,
                source_op,
                kept,
            )
        )
        if name in c.replay:
            decisions.append(rng_state_decision(v, c.replay[name]))
    if problem.graph.symbols:
        peak_expr, saved_expr = symbolic_memory(problem, resolved)
    else:
        peak_expr, saved_expr = sympy.Integer(timeline.peak_bytes), sympy.Integer(timeline.saved_bytes)
    return Plan(
        decisions=tuple(decisions),
        saved_bytes=timeline.saved_bytes,
        peak_bytes=timeline.peak_bytes,
        recompute_flops=sum(problem.costs[n] for n in resolved.recomputed),
        baseline=baseline,
        budget_bytes=budget,
        least_peak=least,
        feasible=budget is None or timeline.peak_bytes <= budget,
        solver=solver,
        gap=gap,
        timeline=timeline,
        baseline_timeline=evaluator.timeline(evaluator.baseline().resolved),
        forward_flops=sum(problem.costs[n] for n in forward_order(problem, resolved)),
        peak_bytes_expr=peak_expr,
        saved_bytes_expr=saved_expr,
        problem=problem,
        resolved=resolved,
    )
