"""The report's Pareto figure: measured peak (MiB) against step time relative to the plain compiled row, one panel
per model, drawn by ``remat.plot_pareto`` on its measured axes.

remat's fraction rows become a ``ParetoResult`` (one line), torch's budget rows its ``torch_points`` (markers); the
other rows (eager, the hand recipes, the plain compile, remat at torch's and the recipes' peaks) are added as their
own markers, each recipe and each byte budget labelled with its row.
Built with matplotlib's object-oriented API (``Figure``, saved through its Agg canvas): no pyplot, nothing shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import remat
from remat.pareto import ParetoResult, ParetoRow, TorchPoint
from remat.plots import mib

REMAT_LABEL = "remat (fraction budgets)"
# Other rows drawn on each panel: kind -> (marker, colour, label)
EXTRA = {
    "eager": ("D", "tab:gray", "eager"),
    "checkpoint": ("P", "tab:green", "hand recipe (eager, torch.utils.checkpoint)"),
    "compiled": ("*", "tab:purple", None),  # labelled with the inner compiler's name
    "remat bytes": ("^", "tab:red", "remat (budget = a row's measured peak)"),
}


def _ok(rows: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["model"] == model and "error" not in r]


def pareto_input(rows: list[dict[str, Any]], model: str, inner: str) -> tuple[ParetoResult, list[TorchPoint]] | None:
    """remat's fraction rows of ``model`` as a measured ``ParetoResult`` and torch's rows as its points, both
    relative to the plain compiled row; None when that row or every fraction row is missing."""
    mine = _ok(rows, model)
    ref = next((r for r in mine if r["kind"] == "compiled"), None)
    fractions = [r for r in mine if r["kind"] == "remat" and r.get("budget_kind") == "fraction"]
    if ref is None or not fractions:
        return None
    pareto_rows = tuple(
        ParetoRow(
            solver=REMAT_LABEL,
            budget=r["budget"],
            budget_bytes=r.get("plan_budget_bytes"),
            peak_bytes=r["plan_peak_bytes"],
            saved_bytes=r["plan_saved_bytes"],
            recompute_flops=r["plan_recompute_flops"],
            feasible=r.get("plan_feasible", True),
            measured_peak_bytes=r["measured_peak_bytes"],
            step_ms=r["step_ms"],
            step_ratio=r["step_ms"] / ref["step_ms"],
        )
        for r in fractions
    )
    result = ParetoResult(
        rows=pareto_rows,
        baseline_peak_bytes=fractions[0]["plan_baseline_peak_bytes"],
        baseline_saved_bytes=fractions[0]["plan_baseline_saved_bytes"],
        inner=inner,
        reference_step_ms=ref["step_ms"],
        reference_peak_bytes=ref["measured_peak_bytes"],
    )
    points = [
        TorchPoint(f"torch {r['budget']}", r["measured_peak_bytes"], r["step_ms"] / ref["step_ms"])
        for r in mine
        if r["kind"] == "torch"
    ]
    return result, points


def pareto_figure(rows: list[dict[str, Any]], meta: dict[str, Any]):
    """The figure (a matplotlib ``Figure``), or None when no model has the rows it needs."""
    from matplotlib.figure import Figure

    inner = meta["inner"]
    models = [m for m in meta["workloads"] if pareto_input(rows, m, inner) is not None]
    if not models:
        return None
    fig = Figure(figsize=(5.2 * len(models), 5.0), layout="constrained")
    legend: dict[str, Any] = {}  # label -> handle; a label has the same style on every panel
    for ax, model in zip(fig.subplots(1, len(models), squeeze=False)[0], models):
        result, points = pareto_input(rows, model, inner)
        remat.plot_pareto(result, ax, points or None, measured=True)
        ref_ms = result.reference_step_ms
        for r in _ok(rows, model):
            key = "remat bytes" if r.get("budget_kind") == "bytes" else r["kind"]
            if key not in EXTRA:
                continue
            marker, color, label = EXTRA[key]
            x, y = mib(r["measured_peak_bytes"]), r["step_ms"] / ref_ms
            top = key == "compiled"  # the reference point (1.0) stays visible under coinciding remat points
            ax.plot(
                [x],
                [y],
                marker=marker,
                linestyle="none",
                color=color,
                markersize=9 if top else 6,
                zorder=3 if top else 2,
                label=label or r["row"],
            )
            if key in ("remat bytes", "checkpoint"):
                ax.annotate(
                    r["row"].removeprefix("remat bytes = "),
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize="x-small",
                    color=color,
                )
        ax.get_legend().remove()  # one legend for the figure, below the panels, hides no point
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
        ax.set_title(f"{model}: measured peak vs step time", fontsize="medium")
        ax.set_xlim(left=0)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncols=min(len(legend), 3), fontsize="small")
    fig.suptitle(f"torch {meta['torch']}, inner compiler {inner}", fontsize="small")
    return fig


def write_pareto(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path | None:
    """Draw and save the figure as PNG; returns ``path``, or None when there was nothing to draw or no matplotlib."""
    try:
        fig = pareto_figure(rows, meta)
    except ImportError:
        return None
    if fig is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
