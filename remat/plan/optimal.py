"""Optimal solver: a mixed-integer program solved by HiGHS (scipy.optimize.milp).

Variables: for every candidate value, s (saved) and r (recomputed). Constraints: what backward reads is saved or
recomputed; a recomputed value's forward inputs are saved or recomputed; must-save values are never recomputed,
views and tuples never saved. Memory rows bound, at every forward and backward step, a *lower bound* of the
simulated live bytes: storages that are live whatever the plan (forward-output ancestors, backward temporaries,
forward outputs), plus saved values until their last backward reader and directly-read recomputed values between
their first and last backward reader. Minimising recompute cost under that relaxation gives a lower bound on the
cost of any plan meeting the budget (`Plan.gap` is measured against it). Each solution is simulated; if its real
peak is over the budget the memory rows are tightened by the excess and the program solved again. The best
simulated-feasible plan found is returned; the heuristic families serve as incumbents, as a MIP start would.
`solve` has the signature every solver has (solvers.py); the time limit per MILP is the evaluator's.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import scipy.optimize as opt
import scipy.sparse as sp

from ..capture import Role
from . import greedy, mincut
from .evaluate import Evaluator, Scored, pick
from .family import heuristic_family
from .problem import Problem

MAX_ROUNDS = 6


@dataclasses.dataclass(frozen=True)
class Model:
    names: tuple[str, ...]
    cost: np.ndarray
    structure: tuple  # (A, lb, ub) of the non-memory constraints
    memory: sp.csr_matrix  # rows: steps; columns: [s..., r...]
    base: np.ndarray  # bytes live at each row whatever the plan
    fixed: tuple[np.ndarray, np.ndarray]  # variable bounds


def build(problem: Problem) -> Model:
    graph, c = problem.graph, problem.constraints
    names = problem.candidates
    col = {n: i for i, n in enumerate(names)}
    k = len(names)
    rows, lo, hi = [], [], []

    def row(entries: dict[int, float], low: float, high: float) -> None:
        rows.append(entries)
        lo.append(low)
        hi.append(high)

    for n in names:
        row({col[n]: 1, k + col[n]: 1}, 1 if n in problem.needed else 0, 1)
        for inp in graph[n].inputs:
            if inp in col:
                row({col[inp]: 1, k + col[inp]: 1, k + col[n]: -1}, 0, 1)
    upper = np.ones(2 * k)
    for n in names:
        if n in c.must_save:
            upper[k + col[n]] = 0
        if n in c.must_recompute or not graph[n].is_tensor:
            upper[col[n]] = 0
    a = _sparse(rows, 2 * k)
    memory, base = _memory_rows(problem, col)
    cost = np.array([problem.solver_cost(n) for n in names], dtype=float)
    return Model(names, cost, (a, np.array(lo, float), np.array(hi, float)), memory, base,
                 (np.zeros(2 * k), upper))


def _sparse(rows: list[dict[int, float]], width: int) -> sp.csr_matrix:
    data, ri, ci = [], [], []
    for r, entries in enumerate(rows):
        for cidx, v in entries.items():
            ri.append(r)
            ci.append(cidx)
            data.append(v)
    return sp.csr_matrix((data, (ri, ci)), shape=(len(rows), width))


def _memory_rows(problem: Problem, col: dict[str, int]) -> tuple[sp.csr_matrix, np.ndarray]:
    graph = problem.graph
    k = len(col)
    excluded = {graph[o].storage for o in graph.bw_outputs}
    outputs = {graph[o].storage for o in graph.fw_outputs if graph[graph[o].storage].role is Role.FORWARD}
    fw_steps = [n for n in problem.forward if n in problem.fw_required]
    pos = {n: i for i, n in enumerate(fw_steps)}
    last_fw: dict[str, int] = {}
    for n in fw_steps:
        for inp in graph[n].inputs:
            owner = graph[inp].storage
            if owner in pos:
                last_fw[owner] = pos[n]
    base = []
    rows: list[dict[int, float]] = []
    entries: dict[int, float]
    for t, n in enumerate(fw_steps):
        live, entries = 0, {}
        for m in fw_steps[: t + 1]:
            v = graph[m]
            if v.is_view or not v.nbytes:
                continue
            if m in outputs or last_fw.get(m, pos[m]) >= t:
                live += v.nbytes
            elif m in col:
                entries[col[m]] = v.nbytes
        for m, i in col.items():
            if m not in pos and graph[m].index < graph[n].index and not graph[m].is_view:
                entries[i] = graph[m].nbytes
        base.append(live)
        rows.append(entries)
    bw_pos = {n: i for i, n in enumerate(problem.backward)}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for n in problem.backward:
        for inp in graph[n].inputs:
            owner = graph[inp].storage
            first.setdefault(owner, bw_pos[n])
            last[owner] = bw_pos[n]
    out_bytes = sum(graph[o].nbytes for o in outputs)
    for t, n in enumerate(problem.backward):
        live = out_bytes
        for m in problem.backward[: t + 1]:
            v = graph[m]
            if not v.is_view and m not in excluded and last.get(m, bw_pos[m]) >= t:
                live += v.nbytes
        entries = {}
        for m, i in col.items():
            v = graph[m]
            if v.is_view or m in outputs or m not in last or last[m] < t:
                continue
            entries[i] = v.nbytes
            if first[m] <= t:
                entries[k + i] = v.nbytes
        base.append(live)
        rows.append(entries)
    return _sparse(rows, 2 * k), np.array(base, dtype=float)


def _solve(model: Model, limit: float, time_limit: float):
    k = len(model.names)
    a, lo, hi = model.structure
    cons = [opt.LinearConstraint(a, lo, hi)]
    if model.memory.shape[0]:
        cons.append(opt.LinearConstraint(model.memory, -np.inf, limit - model.base))
    # A tiny price on saved bytes breaks ties toward lower memory.
    objective = np.concatenate([np.full(k, 1e-9), model.cost])
    return opt.milp(objective, constraints=cons, integrality=np.ones(2 * k),
                    bounds=opt.Bounds(*model.fixed), options={"time_limit": time_limit})


def _chosen(model: Model, x: np.ndarray, problem: Problem) -> list[str]:
    k = len(model.names)
    return [n for i, n in enumerate(model.names) if x[k + i] > 0.5 and n in problem.choosable]


def least_peak(problem: Problem, evaluator: Evaluator) -> Scored:
    """The least-peak plan the MILP finds below the heuristics' least peak: solve for a peak one byte under the
    best known, simulate, keep the result if its real peak is lower, repeat. Memoised per problem, so fractions
    and infeasible budgets resolve against the same least peak on every call."""
    def descend(problem: Problem, evaluator: Evaluator) -> list[Scored]:
        incumbents = evaluator.family("greedy", greedy.family) + evaluator.family("mincut", mincut.family)
        best = pick(incumbents, -1)  # least peak, then least cost
        if not problem.choosable:
            return [best]
        model, limit = build(problem), best.peak - 1
        for _ in range(MAX_ROUNDS):
            res = _solve(model, limit, evaluator.time_limit)
            if res.x is None:
                break
            found = evaluator.score(_chosen(model, res.x, problem))
            if found.peak < best.peak or (found.peak == best.peak and found.cost < best.cost):
                best = found
            limit = min(limit, found.peak) - 1 if found.peak <= limit else limit - (found.peak - limit)
        return [best]

    return evaluator.family("optimal-least", descend)[0]


def solve(problem: Problem, budget: int | None, evaluator: Evaluator) -> Scored:
    """The cheapest plan found meeting `budget`, of the MILP's solutions (each simulated) and the incumbents: both
    heuristics' families with their variants and the least-peak plan. Its `bound` is the MILP's lower bound on
    recompute cost when the plan meets the budget (None when no bound was proved)."""
    incumbents = heuristic_family(evaluator, ("greedy", "mincut")) + [least_peak(problem, evaluator)]
    if budget is None or not problem.choosable:
        return evaluator.pick(incumbents, budget)
    model = build(problem)
    bound, limit, found = None, float(budget), []
    for _ in range(MAX_ROUNDS):
        res = _solve(model, limit, evaluator.time_limit)
        if res.x is None:
            break
        if bound is None:
            bound = float(getattr(res, "mip_dual_bound", None) or res.fun)
        scored = evaluator.score(_chosen(model, res.x, problem))
        found.append(scored)
        if scored.peak <= budget:
            break
        limit -= max(scored.peak - budget, 1)
    best = evaluator.pick(found + incumbents, budget)
    return dataclasses.replace(best, bound=bound) if best.peak <= budget else best
