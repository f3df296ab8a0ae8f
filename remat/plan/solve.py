"""(problem, budget, solver) → Plan. The one entry point the backend and `explain` use."""
from __future__ import annotations

import dataclasses
import types
import warnings

import sympy

from ..annotate import Action
from ..capture import Role
from ..units import fmt_bytes, fmt_flops, short_op
from . import greedy, mincut, optimal
from .decisions import rng_state_decision, transfer_decision
from .evaluate import Evaluator, Scored, pick, pick_frugal
from .plan import Baseline, Decision, Plan
from .problem import Problem
from .recipes import SAVED_OPS, recipes
from .schedule import forward_order
from .symbolic import symbolic_memory

SOLVERS = ("auto", "mincut", "greedy", "optimal")
HEAVY_OPS = SAVED_OPS | {"aten.convolution.default"}


class BudgetError(ValueError):
    """Raised with strict=True when the memory budget cannot be met; `least`: the least peak reachable (bytes)."""

    def __init__(self, message: str, least: int | None = None):
        super().__init__(message)
        self.least = least


def heuristic_family(evaluator: Evaluator, solver: str) -> list[Scored]:
    """The plans a solver chooses from: the inner compiler's own plan, the hand-written recipes (recipes.py), and
    the solver's proposals; "auto" (and "optimal", as incumbents) take greedy's and mincut's. Where random ops may
    be replayed, the proposals made with every random op saved (what rng="save" searches) are added, so allowing
    replay never yields a worse plan."""
    parts = {"greedy": ("greedy",), "mincut": ("mincut",)}.get(solver, ("greedy", "mincut"))
    builders = {"greedy": greedy.family, "mincut": mincut.family}
    members = [evaluator.baseline()] + evaluator.family("recipes", recipe_family)
    members += [s for part in parts for s in evaluator.family(part, builders[part])]
    saving = _random_ops_saved(evaluator.problem)
    if saving is not None:
        inner = evaluator.family("rng-saved", lambda p, e: [evaluator.restricted(saving)])[0]
        members += [s for part in parts for s in inner.family(part, builders[part])]
    for kind, kept in _heavy_ops_saved(evaluator.problem):
        inner = evaluator.family(f"saving {kind}", lambda p, e, kept=kept: [evaluator.restricted(kept)])[0]
        members += heuristic_family(inner, solver)
    return members


def _heavy_ops_saved(problem: Problem) -> list[tuple[str, Problem]]:
    """For each compute-heavy op kind (matmuls, attention, convolution) with a choosable output, the same problem
    with every such output saved, as `save_ops=[kind]` would keep them: its plans join the family, so an empty
    save list never yields a costlier plan at a budget than a one-kind list. None under a save list."""
    if problem.constraints.kinds_saved:
        return []
    graph = problem.graph
    by_kind: dict[str, set[str]] = {}
    for name in problem.choosable:
        if graph[name].op in HEAVY_OPS:
            by_kind.setdefault(graph[name].op, set()).add(name)
    return [(kind, _with_saved(problem, names, f"save_ops: {kind}", kinds_saved=True))
            for kind, names in sorted(by_kind.items())]


def _with_saved(problem: Problem, names: set[str], reason: str, kinds_saved: bool = False) -> Problem:
    """`problem` with `names` saved (no longer choosable)."""
    c = problem.constraints
    must_save = dict(c.must_save, **{n: reason for n in names})
    constraints = dataclasses.replace(c, must_save=types.MappingProxyType(must_save),
                                      kinds_saved=c.kinds_saved or kinds_saved)
    return dataclasses.replace(problem, constraints=constraints,
                               choosable=tuple(n for n in problem.choosable if n not in names))


def recipe_family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    return [evaluator.score(chosen, name) for name, chosen in recipes(problem)]


def _random_ops_saved(problem: Problem) -> Problem | None:
    """The same problem with every replayable random op saved, or None when no random op is choosable."""
    graph = problem.graph
    random_ops = set(problem.constraints.replay)
    outputs = {u for n in random_ops if graph[n].is_multi for u in graph[n].users if graph[u].op == "getitem"}
    replayable = (random_ops | outputs) & set(problem.choosable)
    if not replayable:
        return None
    return _with_saved(problem, replayable, "rng: random op saved")


def resolve_budget(kind: str, value: float | int | None, least: int, baseline: int) -> int | None:
    if kind == "none":
        return None
    if kind == "fraction":
        return int(least + value * (baseline - least))
    return int(value)


def make_plan(
    problem: Problem,
    budget_kind: str,
    budget_value: float | int | None,
    solver: str = "auto",
    strict: bool = False,
    time_limit: float = 10.0,
    evaluator: Evaluator | None = None,
    frugal: bool = False,
) -> Plan:
    """Plan one joint graph. `budget_kind` is "none", "bytes" or "fraction" (see RematConfig.memory_budget).
    `frugal`: for a graph that later graphs of its step follow (what it keeps is live while they run, remat/step.py):
    of the plans meeting the budget, the one under which the step would peak lowest were another graph like it to
    follow (evaluate.pick_frugal), rather than the cheapest."""
    evaluator = evaluator or Evaluator(problem)
    base = evaluator.baseline()
    baseline = Baseline(base.saved, base.peak, sum(problem.costs[n] for n in base.resolved.recomputed),
                        problem.baseline.kind)
    if budget_kind == "none":
        return _plan(problem, evaluator, base, baseline, None, None, "baseline", None)
    # The least peak reachable by this solver's proposals (optimal's include both heuristics' as incumbents).
    lowest = min(heuristic_family(evaluator, solver), key=lambda s: s.peak)
    if solver == "optimal":
        lowest = min((lowest, optimal.least_peak(problem, evaluator, time_limit)), key=lambda s: s.peak)
    least = lowest.peak
    budget = resolve_budget(budget_kind, budget_value, least, base.peak)
    gap = None
    if solver == "optimal":
        chosen, bound = optimal.solve(problem, budget, evaluator, time_limit)
        # The MILP run for this budget can reach below the least-peak search's result: report what was reached.
        if chosen.peak > budget and lowest.peak < chosen.peak:
            chosen, bound = lowest, None  # the MILP missed the budget by more than the least-peak plan does
        incumbent = pick(heuristic_family(evaluator, solver), budget)  # the variants optimal's MILP does not see
        if incumbent.peak <= budget and (chosen.peak > budget or incumbent.cost < chosen.cost):
            chosen = incumbent
        least = min(least, chosen.peak)
        if frugal:
            chosen, bound = pick_frugal(heuristic_family(evaluator, solver) + [chosen], budget, least), None
        if bound is not None and chosen.cost > 0:
            gap = max(0.0, (chosen.cost - bound) / chosen.cost)
        elif bound is not None:
            gap = 0.0
    else:
        family = heuristic_family(evaluator, solver)
        chosen = pick_frugal(family, budget, least) if frugal else pick(family, budget)
    if chosen.peak > budget:
        message = (
            f"memory_budget: {fmt_bytes(budget)} cannot be met for this graph; the least peak solver={solver!r} can "
            f"reach is {fmt_bytes(least)} ({least} bytes)"
        )
        if strict:
            raise BudgetError(f"{message}; strict=True: raise the budget to at least {least} bytes", least)
        warnings.warn(f"{message}; using the plan with that peak", stacklevel=2)
    return _plan(problem, evaluator, chosen, baseline, budget, least, solver, gap)


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
        decisions.append(Decision(name, v.op, v.module_path, v.shape, v.dtype, v.nbytes, problem.costs[name],
                                  action, reason, source_op, kept))
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
        least_peak_bytes=least,
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
