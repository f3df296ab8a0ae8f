"""Plan and Decision: what the planner decided, per value, and the figures that follow from it."""
from __future__ import annotations

import dataclasses

from ..annotate import Action
from .simulate import Timeline


@dataclasses.dataclass(frozen=True)
class Decision:
    """The planner's decision for one forward value that backward needs."""

    name: str
    op: str
    module_path: str
    shape: tuple
    dtype: str
    nbytes: int  # bytes of storage the value owns (0 for views)
    cost: int  # flops to recompute it once
    action: Action  # SAVE or RECOMPUTE
    reason: str


@dataclasses.dataclass(frozen=True)
class Baseline:
    """Figures of the plan that saves everything backward reads (what torch's default partition does)."""

    saved_bytes: int
    peak_bytes: int
    recompute_flops: int = 0


@dataclasses.dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]  # one per value backward needs, in schedule order
    saved_bytes: int  # bytes the forward hands to backward
    peak_bytes: int  # simulated peak of activation memory over forward + backward
    recompute_flops: int  # flops spent recomputing in backward
    baseline: Baseline
    budget_bytes: int | None  # the budget in bytes (fractions resolved); None = no budget
    least_peak_bytes: int | None  # the least peak the planner can reach (None when not computed: no budget)
    feasible: bool
    solver: str
    gap: float | None  # (cost - lower bound) / cost against the optimal solver's bound, when computed
    timeline: Timeline

    @property
    def saved(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.action is Action.SAVE)

    @property
    def recomputed(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.action is Action.RECOMPUTE)

    def table(self, max_rows: int | None = None) -> str:
        """A text table: one row per decision, then totals against the baseline."""
        head = ("node", "op", "shape", "dtype", "MiB", "MFLOP", "action", "reason")
        rows = [
            (d.name, d.op, "x".join(map(str, d.shape)), d.dtype, f"{d.nbytes / 2**20:.2f}",
             f"{d.cost / 1e6:.1f}", d.action.value, d.reason)
            for d in self.decisions
        ]
        hidden = 0
        if max_rows is not None and len(rows) > max_rows:
            hidden, rows = len(rows) - max_rows, rows[:max_rows]
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head) - 1)]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in [head, *rows]]
        if hidden:
            lines.append(f"... {hidden} more rows")
        lines.append(self._totals())
        return "\n".join(lines)

    def _totals(self) -> str:
        mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
        budget = "none" if self.budget_bytes is None else mib(self.budget_bytes)
        return (
            f"saved {mib(self.saved_bytes)} (baseline {mib(self.baseline.saved_bytes)}); "
            f"peak {mib(self.peak_bytes)} (baseline {mib(self.baseline.peak_bytes)}; budget {budget}"
            f"{'' if self.feasible else ', not reachable'}); "
            f"recompute {self.recompute_flops / 1e6:.1f} MFLOP; solver {self.solver}"
        )

    def __str__(self) -> str:
        return self.table(max_rows=40)
