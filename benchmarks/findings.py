"""What every check of a benchmark run shares: the ``Finding`` each returns, the limits the report holds rows to,
and small helpers over the rows (checks.py: the memory lines; time_checks.py: the time lines)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from remat.units import MIB as MiB

BUDGET_SLACK = 1.05
"""Measured peak may exceed the budget by this factor (docs/design.md, invariant 2: measured peak <= budget x 1.05)."""
SIM_TOLERANCE = 0.05
"""|measured - simulated| peak may be at most this fraction of the simulated peak."""
NONE_PEAK_SLACK = 1.02
"""`remat None` against the plain compiled row: its measured peak may exceed that row's by this factor."""
RECIPE_ROWS = (("eager+checkpoint", "per-block"), ("per-2-blocks checkpoint", "per-2-blocks"), ("op-SAC", "op-SAC"))
"""The hand-written recipes measured as eager rows, (row name, recipe); remat's row at each recipe's measured peak
is named ``remat bytes = <recipe>`` (``rows.row_specs``)."""
PER_BLOCK = RECIPE_ROWS[0][0]


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool | None
    """True/False for a pass/fail statement; None for a statement that only reports numbers."""
    text: str


def budget_bytes(r: dict[str, Any]) -> int | None:
    """The budget a remat row was planned against, in bytes: the plan's resolved budget (fractions resolved)."""
    if r.get("kind") != "remat" or "error" in r:
        return None
    if r.get("plan_budget_bytes") is not None:
        return r["plan_budget_bytes"]
    return r["budget"] if r.get("budget_kind") == "bytes" else None


def ok_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "error" not in r]


def models(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def row_of(rows: list[dict[str, Any]], model: str, name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["model"] == model and r["row"] == name and "error" not in r), None)


def mib(nbytes: float) -> str:
    return f"{nbytes / MiB:.1f} MiB"


def bytes_text(n: int) -> str:
    return f"{n} B" if abs(n) < 1024 else mib(n)


def yes(ok: bool) -> str:
    return "**yes**" if ok else "**no**"


def join(parts: Iterable[str]) -> str:
    return "; ".join(parts)


def recipe_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(model, recipe, recipe row, remat row at that recipe's measured peak) for every pair measured."""
    pairs = []
    for model in models(rows):
        for name, recipe in RECIPE_ROWS:
            c, r = row_of(rows, model, name), row_of(rows, model, f"remat bytes = {recipe}")
            if c is not None and r is not None and budget_bytes(r):
                pairs.append((model, recipe, c, r))
    return pairs
