"""Solvers side by side on one model: `remat.compare_solvers(model, *inputs, memory_budget=...)`.

The joint graph is captured once; each solver then plans it under the same config, timed.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

from .config import RematConfig
from .explain import Captured, capture_joints
from .pipeline import plan_joint
from .plan.evaluate import Evaluator
from .plan.plan import Plan
from .plan.solve import resolve_budget
from .plan.solvers import DEFAULT, SOLVERS, Solver, named
from .units import fmt_bytes, fmt_flops, render_table


@dataclasses.dataclass(frozen=True)
class SolverRow:
    """One solver's plan of the model (summed over its graphs when it compiles to several)."""

    solver: str
    recompute_flops: int  # flops recomputed in backward, all graphs
    peak_bytes: int  # simulated peak; the largest of the graphs' peaks
    saved_bytes: int  # bytes handed from forward to backward, all graphs
    feasible: bool  # every graph's peak meets the budget
    seconds: float  # wall time of planning (capture facts, costs, constraints, solve), all graphs
    gap: float | None  # (recompute_flops - optimal's) / optimal's; None without "optimal"; inf if optimal's is 0
    plans: tuple[Plan, ...] = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class SolverComparison:
    """Rows in the order the solvers were given; iterates, indexes and `len`s like a list of SolverRow."""

    rows: tuple[SolverRow, ...]
    budget_bytes: int | None  # the budget in bytes every solver planned under (of the last graph); None = no budget

    def __iter__(self) -> Iterator[SolverRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> SolverRow:
        return self.rows[i]

    def row(self, solver: str) -> SolverRow:
        for r in self.rows:
            if r.solver == solver:
                return r
        raise KeyError(f"compare_solvers: no row for solver={solver!r}; rows: {[r.solver for r in self.rows]}")

    def to_records(self) -> list[dict]:
        """Plain dicts, one per row (pandas-ready)."""
        return [{f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "plans"} for r in self.rows]

    def table(self) -> str:
        head = ("solver", "recompute", "peak", "saved", "feasible", "planning", "gap to optimal")
        rows = [
            (
                r.solver,
                fmt_flops(r.recompute_flops),
                fmt_bytes(r.peak_bytes),
                fmt_bytes(r.saved_bytes),
                "yes" if r.feasible else "no",
                f"{r.seconds:.3f} s",
                _gap(r.gap),
            )
            for r in self.rows
        ]
        lines = render_table([head, *rows])
        budget = "none" if self.budget_bytes is None else fmt_bytes(self.budget_bytes)
        lines.append(f"budget {budget}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _gap(gap: float | None) -> str:
    if gap is None:
        return "-"
    return "inf" if gap == float("inf") else f"{100 * gap:+.1f}%"


_ALL_BUT_DEFAULT = tuple(name for name in SOLVERS if name != DEFAULT)


def compare_solvers(
    model: Callable[..., Any],
    *inputs: Any,
    memory_budget: Any,
    solvers: Sequence[str | Solver] = _ALL_BUT_DEFAULT,
    **fields: Any,
) -> SolverComparison:
    """Plan `model(*inputs)` with each solver under `memory_budget` and the other RematConfig `fields`; nothing is
    run beyond tracing, and the graph is traced once. `solvers`: names in the registry (remat/plan/solvers.py; by
    default every one but "auto", which picks among the others) or callables with their signature.

    Every solver gets the same budget in bytes: a fraction is resolved once per graph against the least peak any
    solver reaches (as solver="auto" resolves it), not against each solver's own least. A solver that cannot meet
    it shows feasible=False (and may then recompute less than the optimal plan: a negative gap). The gap column
    compares recompute flops with the "optimal" row when it is among `solvers`.
    """
    if "solver" in fields:
        raise TypeError("compare_solvers: pass solvers=(...) rather than solver=")
    for s in solvers:  # validate every option before tracing
        RematConfig(memory_budget=memory_budget, solver=s, **fields)
    inner = RematConfig(memory_budget=memory_budget, **fields).inner
    joints = capture_joints(model, *inputs, inner=inner)
    budgets = [_bytes_budget(c, memory_budget, fields) for c in joints]
    rows = []
    for solver in solvers:
        configs = [RematConfig(memory_budget=b, solver=solver, **fields) for b in budgets]
        plans = []
        with warnings.catch_warnings():
            # Infeasibility is a column of the table, not a warning per solver.
            warnings.filterwarnings("ignore", message="memory_budget: .* cannot be met")
            start = time.perf_counter()
            for c, config in zip(joints, configs):
                plans.append(plan_joint(c.joint, c.num_fwd_outputs, config).plan)
            seconds = time.perf_counter() - start
        rows.append(
            SolverRow(
                solver=named(solver)[0],
                recompute_flops=sum(p.recompute_flops for p in plans),
                peak_bytes=max(p.peak_bytes for p in plans),
                saved_bytes=sum(p.saved_bytes for p in plans),
                feasible=all(p.feasible for p in plans),
                seconds=seconds,
                gap=None,
                plans=tuple(plans),
            )
        )
    best = next((r for r in rows if r.solver == "optimal"), None)
    if best is not None:
        rows = [dataclasses.replace(r, gap=_relative(r.recompute_flops, best.recompute_flops)) for r in rows]
    return SolverComparison(tuple(rows), budgets[-1])


def _bytes_budget(captured: Captured, memory_budget: Any, fields: dict) -> Any:
    """`memory_budget` as the int bytes solver="auto" would resolve it to on this graph (None and bytes unchanged)."""
    config = RematConfig(memory_budget=memory_budget, **fields)
    if config.budget_kind() != "fraction":
        return config.budget_bytes() if config.budget_kind() == "bytes" else None
    problem = plan_joint(
        captured.joint, captured.num_fwd_outputs, dataclasses.replace(config, memory_budget=None)
    ).problem
    with Evaluator(problem) as evaluator:
        least = SOLVERS[DEFAULT](problem, 0, evaluator).peak
        return resolve_budget("fraction", config.budget_fraction(), least, evaluator.score(()).peak)


def _relative(cost: int, optimal: int) -> float:
    if optimal > 0:
        return (cost - optimal) / optimal
    return 0.0 if cost == 0 else float("inf")
