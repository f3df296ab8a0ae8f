"""Plan and Decision: what the planner decided, per value, and the figures that follow from it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import sympy

from ..annotate import Action
from ..runtime.table import MOVES
from .simulate import Timeline

if TYPE_CHECKING:
    from ..step import Share
    from .problem import Problem, Resolved


# Actions that hand the value from forward to backward: as it is, or in the form of a move (runtime/table.py).
KEPT = (Action.SAVE, *(Action(action) for action in MOVES))


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
    action: Action  # SAVE, RECOMPUTE, OFFLOAD or PARTITION (SHARD)
    reason: str  # why, in words: the rule or the solver's trade ("recomputed (mincut): 0.7 MFLOP frees 0.03 MiB")
    source_op: str = ""  # for a getitem, the op of the tuple producer it reads ("aten.native_dropout.default")
    kept_bytes: int | None = None  # device bytes held from forward to backward; None: nbytes if saved, else 0

    @property
    def kept(self) -> int:
        if self.kept_bytes is not None:
            return self.kept_bytes
        return self.nbytes if self.action is Action.SAVE else 0


@dataclasses.dataclass(frozen=True)
class Baseline:
    """Figures of the inner compiler's own plan, the one `memory_budget=None` runs: `kind` names it ("inductor
    min-cut partition", "aot_eager min-cut partition": torch's min-cut partitioner, as plain torch.compile with that
    backend runs it; "default partition", which saves everything backward reads, under eager and with a policy or a
    save list; "+ checkpoint regions" when the model marks its own)."""

    saved_bytes: int
    peak_bytes: int
    recompute_flops: int = 0
    kind: str = "default partition"


@dataclasses.dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]  # one per value backward needs, in schedule order
    saved_bytes: int  # bytes the forward hands to backward
    peak_bytes: int  # simulated peak of activation memory over forward + backward
    recompute_flops: int  # flops spent recomputing in backward
    baseline: Baseline
    budget_bytes: int | None  # the budget in bytes (fractions resolved); None = no budget
    # The least peak the planner can reach (None: no budget), as `least_peak_bytes` reads it: a byte budget the plan
    # meets does not need it, so it is then searched for when first read (a function until then).
    least_peak: int | Callable[[], int] | None = dataclasses.field(compare=False)
    feasible: bool
    solver: str
    gap: float | None  # (cost - lower bound) / cost against the optimal solver's bound, when computed
    timeline: Timeline
    forward_flops: int = 0  # flops of the forward module under this plan; the base of "+x% flops" (0: unknown)
    baseline_timeline: Timeline | None = None  # the baseline plan's timeline, for overlays
    peak_bytes_expr: sympy.Expr | None = None  # peak_bytes as a function of the dynamic sizes (sympy)
    saved_bytes_expr: sympy.Expr | None = None  # saved_bytes likewise
    notes: tuple[str, ...] = ()  # how the plan came about beyond its decisions ("checkpoint regions not imposed")
    # How a byte budget for the whole step was split for this graph (remat.step.Share): the bytes earlier graphs of
    # the step keep for backward and what was left for this one; None when the graph was planned alone.
    step_share: Share | None = None

    profile: object = None  # remat.runtime.profile.Profile when compiled with profile=True
    # The graph facts the plan was made for and its saved/recomputed sets, so `remat.check_plan(plan)` can check it.
    problem: Problem | None = dataclasses.field(default=None, compare=False, repr=False)
    resolved: Resolved | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def least_peak_bytes(self) -> int | None:
        """The least peak the planner can reach for this graph; None without a budget."""
        if callable(self.least_peak):
            object.__setattr__(self, "least_peak", self.least_peak())
        assert not callable(self.least_peak)
        return self.least_peak

    @property
    def saved(self) -> tuple[str, ...]:
        """Values the forward hands to backward in any form: kept, offloaded or sharded."""
        return tuple(d.name for d in self.decisions if d.action in KEPT)

    @property
    def offloaded(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.action is Action.OFFLOAD)

    @property
    def partitioned(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.action is Action.SHARD)

    @property
    def recomputed(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.action is Action.RECOMPUTE)

    def fingerprint(self) -> str:
        """A stable hash of the decisions; equal on every rank that planned the same graph the same way."""
        from .agree import fingerprint

        return fingerprint(self)

    # The text views below are remat.report's, which reads these classes; they load it when first called, so that
    # planning never imports presentation.

    def table(self, max_rows: int | None = None) -> str:
        """A text table: one row per decision (node, op, shape, dtype, bytes, recompute cost, action, reason), then
        totals summed from all the rows, against the baseline. `max_rows` limits the rows printed, not the totals."""
        from .. import report

        return report.table(self, max_rows)

    def to_records(self) -> list[dict]:
        """One dict per decision, plain python values: `pandas.DataFrame(plan.to_records())` needs nothing else."""
        from .. import report

        return report.records(self)

    def summary(self) -> str:
        """One paragraph in words: saved bytes of the baseline's, what is recomputed and its flops, peak vs budget."""
        from .. import report

        return report.summary(self)

    def by_module(self, depth: int | None = None) -> dict[str, list[Decision]]:
        """Decisions grouped by module path ("blocks.1.attn"; "" outside any submodule), in order of first
        appearance. `depth` cuts paths to that many dotted parts, so "blocks.1.attn.attn_drop" joins
        "blocks.1.attn" at depth 3."""
        from .. import report

        return report.by_module(self.decisions, depth)

    def module_table(self, depth: int | None = None) -> str:
        """One line per module: "blocks.1.attn: recompute softmax, mul; save native_dropout x2"."""
        from .. import report

        return report.module_table(self, depth)

    def plot_timeline(self, ax=None, *, baseline: Timeline | None = None):
        """Live bytes over the forward+backward schedule, baseline overlaid, budget line, recompute shaded.
        Returns a matplotlib Figure (never shown); draws on `ax` when given."""
        from ..plots import plot_timeline

        return plot_timeline(self, ax, baseline=baseline)

    def __str__(self) -> str:
        return self.table(max_rows=40)
