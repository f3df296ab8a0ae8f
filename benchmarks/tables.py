"""The report's tables: each benchmark row as the cells of the flat table, the headline table and the full
tables (report.py puts them together), and the solver comparison."""

from __future__ import annotations

from typing import Any

from findings import budget_bytes

from remat.units import MIB as MiB


COLUMNS = (
    "model",
    "row",
    "budget MiB",
    "saved MiB",
    "sim peak MiB",
    "measured peak MiB",
    "step ms",
    "step time vs eager",
    "max grad diff",
)


def table(columns: tuple[str, ...], cells: list[list[str]]) -> list[str]:
    left = ("model", "row")
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" if c in left else "---:" for c in columns) + "|",
        *("| " + " | ".join(row) + " |" for row in cells),
    ]


def cells(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["model"], r["row"], budget_text(r), f"error: {r['error'][:120]}", "", "", "", "", ""]
    saved = mib(r.get("saved_bytes"))
    if r.get("plan_saved_bytes") is not None:
        saved += f" (plan {mib(r['plan_saved_bytes'])})"
    return [
        r["model"],
        r["row"],
        budget_text(r),
        saved,
        mib(r.get("plan_peak_bytes")),
        mib(r.get("measured_peak_bytes")),
        f"{r['step_ms']:.1f}",
        ratio(r.get("step_vs_eager")),
        grad(r["max_grad_diff"], r["max_grad_rel_err"]),
    ]


HEADLINE_COLUMNS = ("model", "row", "budget", "measured peak MiB", "step time vs eager", "max grad diff")


def in_headline(r: dict[str, Any]) -> bool:
    """eager, the plain compiled row, torch's budget rows and remat's rows with a budget (fraction or bytes)."""
    return r["kind"] in ("eager", "compiled", "torch") or (r["kind"] == "remat" and r.get("budget") is not None)


def headline_table(rows: list[dict[str, Any]]) -> list[str]:
    cells = []
    for r in rows:
        if not in_headline(r):
            continue
        if "error" in r:
            cells.append([r["model"], r["row"], budget_text(r), f"error: {r['error'][:80]}", "", ""])
            continue
        cells.append(
            [
                r["model"],
                r["row"],
                budget_text(r),
                mib(r["measured_peak_bytes"]),
                ratio(r.get("step_vs_eager")),
                grad(r["max_grad_diff"], r["max_grad_rel_err"]),
            ]
        )
    return table(HEADLINE_COLUMNS, cells)


FULL_COLUMNS = (
    "row",
    "budget",
    "saved MiB",
    "sim peak MiB",
    "measured peak MiB",
    "peak / budget",
    "step ms",
    "vs eager",
    "vs compiled",
    "compile s",
    "max grad diff",
)


def full_cells(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["row"], budget_text(r), f"error: {r['error'][:160]}", *[""] * (len(FULL_COLUMNS) - 3)]
    saved = mib(r.get("saved_bytes"))
    if r.get("plan_saved_bytes") is not None:
        saved += f" (plan {mib(r['plan_saved_bytes'])})"
    budget = budget_bytes(r)
    return [
        r["row"],
        budget_text(r),
        saved,
        mib(r.get("plan_peak_bytes")),
        mib(r["measured_peak_bytes"]),
        f"{r['measured_peak_bytes'] / budget:.3f}" if budget else "-",
        f"{r['step_ms']:.1f}",
        ratio(r.get("step_vs_eager")),
        ratio(r.get("step_vs_compiled")),
        f"{r.get('first_step_s', 0):.1f}",
        grad(r["max_grad_diff"], r["max_grad_rel_err"]),
    ]


def solver_section(solvers: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Solver comparison: each model planned by every solver under the same byte budget (`remat.compare_solvers`)."""
    if not solvers:
        return []
    lines = [
        "## Solvers",
        "",
        "Planning only (no training step): each solver plans the model's joint graph under the same byte budget "
        "(the fraction resolved against the least peak solver `auto` reaches). Gap: recompute cost above the "
        "optimal solver's, as a fraction of it.",
        "",
    ]
    cells = []
    for model, records in solvers.items():
        for r in records:
            if "error" in r:
                cells.append([model, str(r["fraction"]), "-", "error", r["error"], "", "", ""])
                continue
            gap = "misses the budget" if not r["feasible"] else "-" if r["gap"] is None else f"{r['gap']:+.1%}"
            cells.append(
                [
                    model,
                    str(r["fraction"]),
                    mib(r["budget_bytes"]),
                    r["solver"],
                    mib(r["peak_bytes"]),
                    f"{r['recompute_flops'] / 1e6:.0f}",
                    f"{r['seconds']:.2f}",
                    gap,
                ]
            )
    lines += table(
        (
            "model",
            "fraction",
            "budget MiB",
            "solver",
            "sim peak MiB",
            "recompute MFLOP",
            "planning s",
            "gap to optimal",
        ),
        cells,
    )
    return lines + [""]


def budget_text(r: dict[str, Any]) -> str:
    budget, kind = r.get("budget"), r.get("budget_kind")
    if budget is None:
        return "-"
    if kind == "bytes":
        return f"{mib(budget)} MiB"
    if kind == "fraction" and r.get("plan_budget_bytes") is not None:
        return f"{budget} → {mib(r['plan_budget_bytes'])} MiB"
    return str(budget)


def mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MiB:.1f}"


def ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def grad(abs_diff: float, rel_err: float) -> str:
    if abs_diff == 0.0:
        return "0"
    return f"{abs_diff:.1e} (rel {rel_err:.2f})"
