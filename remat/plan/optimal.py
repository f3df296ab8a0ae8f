"""Optimal solver: a mixed-integer program solved by HiGHS (scipy.optimize.milp), judged by the simulator.

Variables: for every candidate value, s (saved) and r (recomputed). Constraints: what backward reads is saved or
recomputed; a recomputed value's forward inputs are saved or recomputed; must-save values are never recomputed,
views and tuples never saved. The memory rows are the simulator's own lifetimes made linear (liveness.py): at
every forward step every plan runs and at every backward node, the bytes live whatever the plan, plus each saved
value over the steps it is live when saved and each recomputed value over the steps it is live when recomputed, as
the simulation of the inner compiler (its schedule, fusion and buffer reuse, transfers) has them.

Where the rows are a bound. A term is read off a plan that saves every candidate or one that recomputes every
choosable one; in another plan a value can live longer (a saved value read last by a recomputed reader, a value
the forward computes only as an ancestor of a saved one, a recomputed chain's intermediates, a transfer's shard or
host copy, a replayed op's generator state — none of which the rows count), never shorter, under the eager inner
compilers: there the rows relax the simulation, and the MILP's dual bound is a lower bound on the cost of any plan
whose simulated peak meets the row limit (`Plan.gap`). They are exact for plans that recompute only values read
directly by backward nodes, from saved inputs. Under inductor whether a value is written out at all, and when a
recomputed loop runs, depends on its neighbours' decisions, so the rows can count a buffer the chosen plan never
allocates: no bound is claimed there (`bound` None).

The plans: a staircase of limits traced down once per problem, the same for every budget, from the peak of the
cheapest incumbent (a budget at or above it is met by the cheapest plans: no limit above it can change an answer).
The pool starts with the incumbents — every heuristic's family with its variants (so no heuristic plan meeting a
budget is cheaper) and the MILP's least-peak search — and each step solves the MILP for its limit (the rows
tightened by the excess while a solution simulates over it), keeps the solutions meeting the limit, and goes on to
one byte under the pool's cheapest plan meeting the limit, or lower by a stride (1/GRID of the span from that first
limit down to the incumbents' least peak). A budget is answered by `evaluator.pick` from the whole pool: the
cheapest plan meeting it. As the budget falls, the answer stays while it still meets the budget and otherwise gives
way to one of lower peak, so a lower budget never gets a higher simulated peak, and planning afresh or after other
budgets gives the same plan. Between limits a budget may be answered by a plan found at a lower limit, so the stride
trades cost for planning time. `solve` has the signature every solver has (solvers.py); the time limit per MILP is
the evaluator's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.optimize as opt
import scipy.sparse as sp

from .evaluate import Evaluator, Scored, pick
from .family import BUILDERS, heuristic_family
from .problem import Problem
from .liveness import liveness

MAX_ROUNDS = 3  # MILP solves per step while a solution simulates over the step's limit
MAX_STEPS = 64  # limits the staircase solves for; below the last, budgets are answered from the pool found so far
GRID = 32  # the staircase's limits fall per step by at least 1/GRID of the span from its first limit to the least
UNBOUNDED = 1 << 62  # a budget every plan meets


@dataclasses.dataclass(frozen=True)
class Model:
    names: tuple[str, ...]
    cost: np.ndarray
    structure: tuple  # (A, lb, ub) of the non-memory constraints
    memory: sp.csr_matrix  # rows: liveness.py's rows; columns: [s..., r...]
    base: np.ndarray  # bytes live at each row whatever the plan
    fixed: tuple[np.ndarray, np.ndarray]  # variable bounds
    bounds: bool  # the memory rows relax the simulation, so the MILP's dual bound bounds every plan's cost


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
    return Model(
        names,
        cost,
        (a, np.array(lo, float), np.array(hi, float)),
        memory,
        base,
        (np.zeros(2 * k), upper),
        not problem.fuses,
    )


def _sparse(rows: list[dict[int, float]], width: int) -> sp.csr_matrix:
    data, ri, ci = [], [], []
    for r, entries in enumerate(rows):
        for cidx, v in entries.items():
            ri.append(r)
            ci.append(cidx)
            data.append(v)
    return sp.csr_matrix((data, (ri, ci)), shape=(len(rows), width))


def _memory_rows(problem: Problem, col: dict[str, int]) -> tuple[sp.csr_matrix, np.ndarray]:
    """liveness.py's terms as a matrix: a saved term in the value's s column, a recomputed one in its r column,
    over the term's rows."""
    live = liveness(problem)
    k = len(col)
    data: list[int] = []
    ri: list[int] = []
    ci: list[int] = []
    for offset, terms in ((0, live.saved), (k, live.recomputed)):
        for name, spans in terms.items():
            for first, last, size in spans:
                ri.extend(range(first, last + 1))
                ci.extend([offset + col[name]] * (last - first + 1))
                data.extend([size] * (last - first + 1))
    # duplicate (row, column) entries are summed: a value with two terms over one row counts both
    memory = sp.csr_matrix((np.array(data, float), (ri, ci)), shape=(len(live.rows), 2 * k))
    return memory, np.array(live.base, dtype=float)


def _solve(model: Model, limit: float, time_limit: float):
    k = len(model.names)
    a, lo, hi = model.structure
    cons = [opt.LinearConstraint(a, lo, hi)]
    if model.memory.shape[0]:
        cons.append(opt.LinearConstraint(model.memory, -np.inf, limit - model.base))
    # A tiny price on saved bytes breaks ties toward lower memory.
    objective = np.concatenate([np.full(k, 1e-9), model.cost])
    return opt.milp(
        objective,
        constraints=cons,
        integrality=np.ones(2 * k),
        bounds=opt.Bounds(*model.fixed),
        options={"time_limit": time_limit},
    )


def _chosen(model: Model, x: np.ndarray, problem: Problem) -> list[str]:
    k = len(model.names)
    return [n for i, n in enumerate(model.names) if x[k + i] > 0.5 and n in problem.choosable]


def _search(model: Model, problem: Problem, evaluator: Evaluator, limit: int) -> tuple[list[Scored], float | None]:
    """The MILP's plans for `limit` (the row limit tightened by the excess while a plan simulates over it), and its
    lower bound on the cost of plans meeting `limit` when the rows relax the simulation and HiGHS proved one."""
    found: list[Scored] = []
    bound = None
    rows_limit = float(limit)
    for round_ in range(MAX_ROUNDS):
        res = _solve(model, rows_limit, evaluator.time_limit)
        if round_ == 0 and model.bounds:
            bound = _proved(model, res)
        if res.x is None:
            break
        scored = evaluator.score(_chosen(model, res.x, problem))
        found.append(scored)
        if scored.peak <= limit:
            break
        # the rows must come down by the excess from where they put this plan
        rows_limit = min(rows_limit, _rows_peak(model, res.x)) - max(scored.peak - limit, 1)
    return found, bound


def _proved(model: Model, res) -> float | None:
    """The lower bound HiGHS proved on the cost of the rows' solutions (None: none proved), less the most the
    tie-breaking price on saved values adds. Infeasible rows prove that no plan meets the limit: no bound then
    either, as no plan is returned against it."""
    if res.status not in (0, 1):
        return None
    dual = getattr(res, "mip_dual_bound", None)
    if dual is None and res.status == 0:
        dual = res.fun
    return None if dual is None else max(0.0, float(dual) - 1e-9 * len(model.names))


def _bound(model: Model, limit: int, time_limit: float) -> float | None:
    return _proved(model, _solve(model, limit, time_limit))


class Staircase:
    """The plans budgets are answered from, found once per problem by tracing the limits from the top.

    `fixed`: every heuristic's family with its variants and the least-peak search's plans (least_peak); `least`
    their least peak. `found`: what the MILP found at the limits, each at or under the limit it was solved for and
    above `least`; `bounds`: per limit, the MILP's lower bound on the cost of plans meeting it (None
    where none was proved). Limits fall from the peak of the cheapest plan of `fixed` by at least 1/GRID of the
    span between it and `least` per step, and to one byte under the pool's cheapest plan meeting the last limit,
    stopping at the heuristics' least peak on the way."""

    def __init__(self, problem: Problem, evaluator: Evaluator):
        self.problem, self.evaluator = problem, evaluator
        heuristics = heuristic_family(evaluator, tuple(BUILDERS))
        self.model = build(problem)
        lowest = pick(heuristics, -1)  # no plan meets -1 bytes: the heuristics' least-peak plan
        self.fixed = heuristics + least_peak(self.model, problem, evaluator, lowest)
        # pick simulates only the plans its answer may depend on (evaluate.pick), not the whole pool
        self.least = pick(self.fixed, -1).peak
        self.floor = lowest.peak  # fraction 0.0 where the heuristics' least peak is the least
        # Every budget at or above the peak of the pool's cheapest plan is answered by that plan, so the limits start
        # there; nothing to trace without a choice.
        self.limit = pick(self.fixed, UNBOUNDED).peak if problem.choosable else -1
        self.stride = max(1, (self.limit - self.least) // GRID)
        self.found: list[Scored] = []  # the plans the limits' MILPs found
        self.bounds: list[tuple[int, float | None]] = []

    def down_to(self, budget: int) -> list[Scored]:
        """The pool for `budget`: the fixed plans and what every limit found. The whole staircase is traced on the
        first call, so the pool is the same whatever budget was asked first: a budget's answer is the pool's
        cheapest plan meeting it, and the answer to a lower budget is either the same plan or one of lower peak."""
        while self.limit >= self.least and len(self.bounds) < MAX_STEPS:
            found, bound = _search(self.model, self.problem, self.evaluator, self.limit)
            self.found += [s for s in found if self.least < s.peak <= self.limit]
            self.bounds.append((self.limit, bound))
            best = pick(self.fixed + self.found, self.limit)
            step = min(best.peak - 1, self.limit - self.stride)
            self.limit = self.floor if step < self.floor < self.limit else step
        return self.fixed + self.found


def least_peak(model: Model, problem: Problem, evaluator: Evaluator, best: Scored) -> list[Scored]:
    """The MILP's plans from one byte under `best`'s peak down: each round solves for one byte under the least peak
    found so far, the rows tightened by the excess while a plan simulates over it; MAX_ROUNDS solves."""
    found: list[Scored] = []
    target = best.peak - 1
    limit = float(target)
    for _ in range(MAX_ROUNDS if problem.choosable else 0):
        res = _solve(model, limit, evaluator.time_limit)
        if res.x is None:
            break
        scored = evaluator.score(_chosen(model, res.x, problem))
        found.append(scored)
        if scored.peak <= target:
            target = scored.peak - 1
            limit = float(target)
        else:
            limit = min(limit, _rows_peak(model, res.x)) - (scored.peak - target)
    return found


def _rows_peak(model: Model, x: np.ndarray) -> float:
    """The highest row of the memory rows at solution `x`."""
    return float((model.base + model.memory @ np.round(x)).max(initial=0.0))


def solve(problem: Problem, budget: int | None, evaluator: Evaluator) -> Scored:
    """The pool's cheapest plan meeting `budget` (evaluator.pick; the least-peak plan when none does). When it meets
    the budget, its `bound` is the best lower bound the MILP proved for the budget or a limit above it (None under
    inductor, where the rows do not relax the simulation)."""
    if budget is None:
        return evaluator.pick(heuristic_family(evaluator, tuple(BUILDERS)), None)
    stairs = evaluator.once("optimal", Staircase)
    chosen = evaluator.pick(stairs.down_to(budget), budget)
    if chosen.peak > budget:
        return chosen
    proved = [b for limit, b in stairs.bounds if limit >= budget and b is not None]
    if stairs.model.bounds:  # the tightest: the MILP for the budget itself (the plan stays the pool's)
        proved += [b for b in (_bound(stairs.model, budget, evaluator.time_limit),) if b is not None]
    return chosen.with_bound(max(proved, default=None))
