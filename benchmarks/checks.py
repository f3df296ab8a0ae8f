"""What a benchmark run shows, computed from its rows: every statement in the report's "What this shows" section
is derived here from the measured numbers, so a claim can never outlive the data it was made from.

Each check returns one ``Finding``: a verdict (True/False, or None where it only reports numbers) and a sentence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from remat.units import MIB as MiB

BUDGET_SLACK = 1.05
"""Measured peak may exceed the budget by this factor (docs/design.md, invariant 2: measured peak <= budget x 1.05)."""


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


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "error" not in r]


def _models(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def _row(rows: list[dict[str, Any]], model: str, name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["model"] == model and r["row"] == name and "error" not in r), None)


def _mib(nbytes: float) -> str:
    return f"{nbytes / MiB:.1f} MiB"


def _bytes(n: int) -> str:
    return f"{n} B" if abs(n) < 1024 else _mib(n)


def _yes(ok: bool) -> str:
    return "**yes**" if ok else "**no**"


def _join(parts: Iterable[str]) -> str:
    return "; ".join(parts)


def within_budget(rows: list[dict[str, Any]]) -> Finding:
    """Every remat row with a budget: measured peak <= 1.05 x the budget it was planned against."""
    checked = [(r, r["measured_peak_bytes"] / budget_bytes(r)) for r in _ok(rows)
               if budget_bytes(r)]
    if not checked:
        return Finding("within_budget", None, "No remat row with a budget was measured.")
    worst_row, worst = max(checked, key=lambda item: item[1])
    over = [(r, ratio) for r, ratio in checked if ratio > BUDGET_SLACK]
    text = (f"remat's measured peak ≤ {BUDGET_SLACK} × budget on every remat row with a budget "
            f"(fraction rows against the plan's resolved budget in bytes): {_yes(not over)} — {len(checked)} rows, "
            f"worst ratio {worst:.3f} ({worst_row['model']} `{worst_row['row']}`)")
    excess_row = max((r for r, _ in checked), key=lambda r: r["measured_peak_bytes"] - budget_bytes(r))
    excess = excess_row["measured_peak_bytes"] - budget_bytes(excess_row)
    if excess > 0:
        text += (f"; largest excess over the budget {_bytes(excess)} ({excess_row['model']} "
                 f"`{excess_row['row']}`)")
    text += "."
    if over:
        text += " Over: " + _join(_over(r, ratio) for r, ratio in over) + "."
    return Finding("within_budget", not over, text)


def _over(r: dict[str, Any], ratio: float) -> str:
    text = f"{r['model']} `{r['row']}` {ratio:.3f} × budget ({_mib(r['measured_peak_bytes'] - budget_bytes(r))} over"
    if not r.get("plan_feasible", True):
        text += f"; budget infeasible, least reachable peak {_mib(r['plan_least_peak_bytes'])}"
    return text + ")"


def monotone(rows: list[dict[str, Any]]) -> Finding:
    """Per model, over all remat rows with a budget: a lower budget never gives a higher measured peak."""
    parts, ok = [], True
    for model in _models(rows):
        budgeted = sorted(((budget_bytes(r), r) for r in _ok(rows)
                           if r["model"] == model and budget_bytes(r) and not r.get("options")),
                          key=lambda item: item[0])
        if len(budgeted) < 2:
            continue
        worse = [(lo, hi) for i, (b_lo, lo) in enumerate(budgeted) for b_hi, hi in budgeted[i + 1:]
                 if b_lo < b_hi and lo["measured_peak_bytes"] > hi["measured_peak_bytes"]]
        ok = ok and not worse
        peaks = " ≥ ".join(f"{r['measured_peak_bytes'] / MiB:.1f}" for _, r in reversed(budgeted))
        parts.append(f"{model}: {peaks} MiB" + ("" if not worse else " — rises at " + _join(
            f"`{lo['row']}` ({_mib(lo['measured_peak_bytes'])}) vs `{hi['row']}` ({_mib(hi['measured_peak_bytes'])})"
            for lo, hi in worse)))
    if not parts:
        return Finding("monotone", None, "Fewer than two remat rows with a budget per model: monotonicity not checked.")
    return Finding("monotone", ok, "remat's measured peak never rises as its budget (in bytes) falls: "
                   f"{_yes(ok)} — {_join(parts)} (highest budget first).")


def torch_rises(rows: list[dict[str, Any]], lo: float = 0.0, hi: float = 0.5) -> Finding:
    """torch's measured peak at activation_memory_budget ``lo`` against ``hi``."""
    parts, rises = [], []
    for model in _models(rows):
        a, b = _row(rows, model, f"torch budget {lo}"), _row(rows, model, f"torch budget {hi}")
        if a is None or b is None:
            continue
        ratio = a["measured_peak_bytes"] / b["measured_peak_bytes"]
        rises.append(ratio > 1.0)
        parts.append(f"{model}: {_mib(a['measured_peak_bytes'])} at {lo} vs {_mib(b['measured_peak_bytes'])} at {hi} "
                     f"({ratio:.2f}×)")
    if not parts:
        return Finding("torch_rises", None, f"torch budget {lo} and {hi} rows not both measured.")
    n = sum(rises)
    return Finding("torch_rises", None, f"torch's measured peak at activation_memory_budget {lo} vs {hi}: "
                   f"{_join(parts)} — higher at the lower budget on {n} of {len(parts)} models.")


def grads(rows: list[dict[str, Any]], inner: str) -> Finding:
    """Gradients against eager: remat rows must be bitwise equal under aot_eager and within relative error 1e-5
    under inductor (docs/design.md, invariant 1); torch's budget rows are reported alongside."""
    remat_rows = [r for r in _ok(rows) if r["kind"] == "remat"]
    torch_rows = [r for r in _ok(rows) if r["kind"] == "torch"]
    if not remat_rows:
        return Finding("grads", None, "No remat row was measured.")
    worst = max(remat_rows, key=lambda r: (r["max_grad_diff"], r["max_grad_rel_err"]))
    tol = 0.0 if inner != "inductor" else 1e-5
    ok = all(r["max_grad_rel_err"] <= tol for r in remat_rows)
    rule = "bitwise equal" if tol == 0.0 else f"relative error ≤ {tol:g}"
    if worst["max_grad_diff"] == 0.0:
        found = "0"
    else:
        found = (f"{worst['max_grad_diff']:.1e} ({worst['model']} `{worst['row']}`, "
                 f"rel {worst['max_grad_rel_err']:.2g})")
    text = (f"remat's gradients {rule} to eager on all {len(remat_rows)} remat rows: {_yes(ok)} — "
            f"max grad diff {found}")
    if torch_rows:
        wrong = [r for r in torch_rows if r["max_grad_rel_err"] > tol]
        t = max(torch_rows, key=lambda r: r["max_grad_rel_err"])
        text += (f"; torch's budget rows: {len(wrong)} of {len(torch_rows)} outside that, worst per-parameter "
                 f"relative error {t['max_grad_rel_err']:.2f} ({t['model']} `{t['row']}`)")
    return Finding("grads", ok, text + ".")


def at_torch_peaks(rows: list[dict[str, Any]], budgets: Iterable[float]) -> Finding:
    """remat given torch's measured peak as its byte budget, against that torch row: peak and step time."""
    parts = []
    for model in _models(rows):
        for b in budgets:
            t, r = _row(rows, model, f"torch budget {b}"), _row(rows, model, f"remat bytes = torch {b}")
            if t is None or r is None:
                continue
            parts.append(f"{model} @ torch {b}: peak {_mib(r['measured_peak_bytes'])} vs "
                         f"{_mib(t['measured_peak_bytes'])}, step time {r['step_ms'] / t['step_ms']:.2f}× torch's")
    if not parts:
        return Finding("at_torch_peaks", None, "No `remat bytes = torch b` row next to its torch row.")
    return Finding("at_torch_peaks", None, "remat with torch's measured peak as its byte budget, against that torch "
                   f"row: {_join(parts)}.")


def none_vs_plain(rows: list[dict[str, Any]], inner: str) -> Finding:
    """remat with no budget against the plain compiled row: with no budget remat should keep what the default
    partition keeps, so its measured peak should be no higher (within the same 5% slack); step time is reported."""
    parts, ok = [], True
    for model in _models(rows):
        r, c = _row(rows, model, "remat None"), _row(rows, model, inner)
        if r is None or c is None:
            continue
        ratio = r["measured_peak_bytes"] / c["measured_peak_bytes"]
        ok = ok and ratio <= BUDGET_SLACK
        parts.append(f"{model}: peak {_mib(r['measured_peak_bytes'])} vs {_mib(c['measured_peak_bytes'])} "
                     f"({ratio:.2f}×), step time {r['step_ms'] / c['step_ms']:.2f}×")
    if not parts:
        return Finding("none_vs_plain", None, f"`remat None` and `{inner}` rows not both measured.")
    return Finding("none_vs_plain", ok, f"`remat None` (no budget) measured peak ≤ {BUDGET_SLACK} × plain "
                   f"`{inner}`'s: {_yes(ok)} — {_join(parts)}.")


def least_peaks(rows: list[dict[str, Any]]) -> Finding:
    """Per model, the least measured peak each method reached."""
    parts = []
    for model in _models(rows):
        best = {}
        for label, kind in (("remat", "remat"), ("torch", "torch"), ("per-block checkpoint", "checkpoint")):
            cands = [r for r in _ok(rows) if r["model"] == model and r["kind"] == kind]
            if cands:
                r = min(cands, key=lambda r: r["measured_peak_bytes"])
                best[label] = f"{label} {_mib(r['measured_peak_bytes'])}" + (
                    f" (`{r['row']}`)" if kind != "checkpoint" else "")
        if best:
            parts.append(f"{model}: " + ", ".join(best.values()))
    return Finding("least_peaks", None, "least measured peak per method: " + _join(parts) + ".")


def sim_vs_measured(rows: list[dict[str, Any]]) -> Finding:
    """How far remat's measured peaks are from the plans' simulated peaks."""
    pairs = [r for r in _ok(rows) if r["kind"] == "remat" and r.get("plan_peak_bytes")]
    if not pairs:
        return Finding("sim_vs_measured", None, "No remat plan recorded.")
    worst = max(pairs, key=lambda r: abs(r["measured_peak_bytes"] - r["plan_peak_bytes"]))
    diff = worst["measured_peak_bytes"] - worst["plan_peak_bytes"]
    return Finding("sim_vs_measured", None, f"measured vs simulated peak over {len(pairs)} remat rows: largest "
                   f"difference {diff / MiB:+.2f} MiB ({diff / worst['plan_peak_bytes']:+.1%}, {worst['model']} "
                   f"`{worst['row']}`).")


def problems(rows: list[dict[str, Any]]) -> Finding:
    """Rows that failed, and remat rows whose model compiled to more than one graph."""
    failed = [f"{r['model']} `{r['row']}`: {r['error']}" for r in rows if "error" in r]
    broken = [f"{r['model']} `{r['row']}` ({r['plan_graphs']} graphs)" for r in _ok(rows)
              if r.get("plan_graphs", 1) > 1]
    if not failed and not broken:
        return Finding("problems", True, "every row ran; every remat row compiled to one graph.")
    text = ""
    if failed:
        text += f"{len(failed)} rows failed: " + _join(failed) + ". "
    if broken:
        text += "graph breaks (plan figures are the last graph's): " + _join(broken) + "."
    return Finding("problems", False, text.strip())


def timing_spread(rows: list[dict[str, Any]]) -> Finding:
    """How much the timed steps of one row vary: (slowest - fastest) / median, over the rows."""
    spreads = sorted((((max(r["step_ms_all"]) - min(r["step_ms_all"])) / r["step_ms"], r) for r in _ok(rows)
                      if len(r.get("step_ms_all", ())) > 1), key=lambda item: item[0])
    if not spreads:
        return Finding("timing_spread", None, "one timed step per row: no spread to report.")
    median = spreads[len(spreads) // 2][0]
    worst, r = spreads[-1]
    return Finding("timing_spread", None, f"timing noise: (slowest - fastest) / median of a row's timed steps is "
                   f"{median:.0%} on the median row, {worst:.0%} at most ({r['model']} `{r['row']}`); step-time "
                   "differences smaller than that are within this run's noise.")


def all_findings(rows: list[dict[str, Any]], inner: str) -> list[Finding]:
    """Every statement of the report's "What this shows", in order; ``inner`` names the plain compiled row."""
    torch_budgets = sorted({r["budget"] for r in rows if r["kind"] == "torch"}, reverse=True)
    found = [within_budget(rows), monotone(rows), grads(rows, inner)]
    if torch_budgets:
        found += [torch_rises(rows, min(torch_budgets), max(torch_budgets)), at_torch_peaks(rows, torch_budgets)]
    return found + [none_vs_plain(rows, inner), least_peaks(rows), sim_vs_measured(rows), timing_spread(rows),
                    problems(rows)]
