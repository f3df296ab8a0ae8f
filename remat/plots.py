"""Figures of a Plan's memory timeline and of a budget sweep (matplotlib; install with `pip install remat[plot]`).

Figures are built with matplotlib's object-oriented API (`matplotlib.figure.Figure`), never through pyplot: nothing
is shown, no figure is registered with pyplot, no backend is selected and no rcParam is changed, so they work
headless and leave matplotlib as they found it. Save one with `fig.savefig("timeline.png")`; in a notebook, show it
with `IPython.display.display(fig)`.

Units: bytes are drawn in MiB (bytes / 2**20, exact for any byte count below 2**53), flops in MFLOP (flops / 1e6,
as in `Plan.table`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .plan.simulate import RECOMPUTE, Timeline
from .units import MIB

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .pareto import ParetoResult
    from .plan.plan import Plan

__all__ = ["plot_timeline", "plot_pareto", "mib", "mflop", "TORCH_LABEL"]

TORCH_LABEL = "torch activation_memory_budget"
# Shaded step kinds: the simulator's kinds other than plain forward/backward (offload/reload join here when they land).
SHADED = {RECOMPUTE: ("tab:orange", "recompute")}


def mib(nbytes: int | float) -> float:
    """Bytes as drawn on the figures' memory axes."""
    return nbytes / MIB


def mflop(flops: int | float) -> float:
    """Flops as drawn on the Pareto figure's overhead axis."""
    return flops / 1e6


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return cast("Figure", ax.get_figure(root=True)), ax  # an Axes' root figure exists
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # matplotlib is an optional dependency
        raise ImportError("remat's plots need matplotlib: pip install 'remat[plot]' (or pip install matplotlib)") from e
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def plot_timeline(plan: Plan, ax: Axes | None = None, *, baseline: Timeline | None = None) -> Figure:
    """Live activation memory (MiB) at every step of the plan's forward+backward schedule.

    Draws, each with a `label` so it can be found on the axes:
      - "plan": `plan.timeline.live` at x = step index (forward steps, then backward with recomputation inlined);
      - "baseline": the timeline of the plan that saves everything backward reads (`baseline`, default
        `plan.baseline_timeline`); each of its steps is drawn at the x of the same node in the plan's schedule, and
        steps the plan does not run at that place (recomputed views, forward values the plan no longer computes in
        forward) are spaced evenly between their neighbours, so the two curves compare memory at the same node;
      - "budget": a horizontal line at `plan.budget_bytes` (absent when the plan has no budget);
      - "recompute": shaded spans over the plan's recomputation steps;
      - "backward starts": a vertical line between the last forward step and the first backward step.
    Draws on `ax` when given and returns its figure; otherwise returns a new Figure. Never shows anything.
    """
    import numpy as np

    timeline = plan.timeline
    base = baseline if baseline is not None else plan.baseline_timeline
    if base is None:
        raise ValueError(
            "plot_timeline: this Plan carries no baseline timeline; pass baseline=<Timeline> "
            "(remat.plan.simulate.simulate(problem, problem.resolve(())))"
        )
    fig, ax = _axes(ax, (9.0, 4.0))
    steps = np.arange(len(timeline.live))
    ax.plot(
        _aligned(timeline, base),
        [mib(b) for b in base.live],
        drawstyle="steps-mid",
        color="tab:gray",
        linewidth=1.0,
        alpha=0.8,
        label="baseline",
    )
    ax.plot(
        steps, [mib(b) for b in timeline.live], drawstyle="steps-mid", color="tab:blue", linewidth=1.5, label="plan"
    )
    if plan.budget_bytes is not None:
        ax.axhline(mib(plan.budget_bytes), color="tab:red", linestyle="--", linewidth=1.0, label="budget")
    for kind, (color, label) in SHADED.items():
        for i, (start, stop) in enumerate(_runs(timeline.kinds, kind)):
            ax.axvspan(
                start - 0.5, stop - 0.5, color=color, alpha=0.25, linewidth=0, label=label if i == 0 else "_nolegend_"
            )
    ax.axvline(timeline.num_forward - 0.5, color="black", linestyle=":", linewidth=1.0, label="backward starts")
    budget = "no budget" if plan.budget_bytes is None else f"budget {mib(plan.budget_bytes):.2f} MiB"
    ax.set_title(
        f"{plan.solver}: peak {mib(plan.peak_bytes):.2f} MiB "
        f"(baseline {mib(plan.baseline.peak_bytes):.2f} MiB, {budget})"
    )
    ax.set_xlabel("step (forward, then backward with recomputation)")
    ax.set_ylabel("live activation memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize="small")
    return fig


def _aligned(plan: Timeline, base: Timeline):
    """x of each baseline step in the plan's schedule: the plan's step index of the same node where both run it
    outside recomputation, interpolated linearly in between. Under inductor the two schedules may order a few
    nodes differently (its peak-memory reordering); a node the plan runs before one the baseline ran earlier is not
    an anchor, so the x positions keep increasing, from the plan's first step to its last."""
    import numpy as np

    last_p, last_x = len(base.live) - 1, len(plan.live) - 1
    if last_p < 0 or last_x < 0:
        return np.zeros(len(base.live))
    where = {name: x for x, (name, kind) in enumerate(zip(plan.steps, plan.kinds)) if kind != RECOMPUTE}
    known_p: list[int] = []
    known_x: list[int] = []
    for p, (name, kind) in enumerate(zip(base.steps, base.kinds)):
        if kind != RECOMPUTE and name in where and (not known_x or where[name] > known_x[-1]):
            known_p.append(p)
            known_x.append(where[name])
    # the first steps and the last steps line up where they are no anchors
    if not known_p or known_p[0] > 0:
        known_p.insert(0, 0)
        known_x.insert(0, 0)
    if known_p[-1] < last_p:
        known_p.append(last_p)
        known_x.append(last_x)
    return np.interp(np.arange(len(base.live)), known_p, known_x)


def _runs(kinds: Sequence[str], kind: str) -> list[tuple[int, int]]:
    """Maximal [start, stop) index ranges where `kinds` equals `kind`."""
    runs, start = [], None
    for i, k in enumerate([*kinds, None]):
        if k == kind and start is None:
            start = i
        elif k != kind and start is not None:
            runs.append((start, i))
            start = None
    return runs


def plot_pareto(
    result: ParetoResult,
    ax: Axes | None = None,
    torch_points: Sequence[tuple[str, int, float]] | None = None,
    *,
    measured: bool | None = None,
) -> Figure:
    """Peak memory against overhead for every (solver, budget) row of a `remat.pareto` sweep: one line per solver
    (label = the solver name), points in the order of the sweep's budgets, each annotated with its budget.

    Two kinds of axes, never mixed:
      - simulated (the default without `torch_points`): x = the planner's simulated peak (MiB), y = recompute MFLOP;
      - measured (`measured=True`, and always with `torch_points`): x = measured peak (MiB), y = step time divided
        by the reference step time (the same model under plain `torch.compile(backend=inner)`; see `remat.pareto`).
    `torch_points`: `(label, peak_bytes, step_time_ratio)` triples, as `remat.pareto.torch_budget_points` returns;
    they are measured, so they are drawn only on measured axes, as markers labelled "torch activation_memory_budget",
    and the sweep must have been run with `measure=True`. Draws on `ax` when given and returns its figure.
    """
    measured = bool(torch_points) if measured is None else measured
    if torch_points and not measured:
        raise ValueError(
            "plot_pareto: torch_points are measured (peak, step-time ratio); they cannot share axes "
            "with simulated peaks and flops — leave measured=None or pass measured=True"
        )
    if measured and not result.measured:
        raise ValueError(
            "plot_pareto: measured axes need measured rows; run remat.pareto(..., measure=True) "
            "(torch's points are measured, so remat's must be measured the same way to share the axes)"
        )
    fig, ax = _axes(ax, (6.5, 4.5))
    for solver in dict.fromkeys(r.solver for r in result.rows):
        rows = [r for r in result.rows if r.solver == solver]
        xs: list[float]
        ys: list[float]
        if measured:  # result.measured (checked above): every row has both
            xs = [mib(r.measured_peak_bytes) for r in rows if r.measured_peak_bytes is not None]
            ys = [r.step_ratio for r in rows if r.step_ratio is not None]
        else:
            xs, ys = [mib(r.peak_bytes) for r in rows], [mflop(r.recompute_flops) for r in rows]
        ax.plot(xs, ys, marker="o", label=solver)
        budgets_at: dict[tuple[float, float], list[str]] = {}  # budgets that landed on the same point share a label
        for r, x, y in zip(rows, xs, ys):
            budgets_at.setdefault((x, y), []).append(_budget_text(r.budget))
        for (x, y), texts in budgets_at.items():
            ax.annotate(", ".join(texts), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
    if torch_points:
        xs, ys = [mib(p[1]) for p in torch_points], [p[2] for p in torch_points]
        ax.plot(xs, ys, marker="s", linestyle="none", color="black", label=TORCH_LABEL)
        for p, x, y in zip(torch_points, xs, ys):
            ax.annotate(str(p[0]), (x, y), textcoords="offset points", xytext=(4, -10), fontsize="x-small")
    if measured:
        ax.set_xlabel("measured peak activation memory (MiB)")
        ax.set_ylabel(f"step time / plain torch.compile(backend={result.inner!r})")
        ax.set_title("measured: peak vs step time")
    else:
        ax.set_xlabel("simulated peak activation memory (MiB)")
        ax.set_ylabel("recompute MFLOP")
        ax.set_title(f"simulated: peak vs recompute (baseline peak {mib(result.baseline_peak_bytes):.2f} MiB)")
    ax.legend(fontsize="small")
    return fig


def _budget_text(budget: Any) -> str:
    return "None" if budget is None else str(budget)
