"""What a benchmark run shows, computed from its rows: every statement in the report's "What this shows" section
is derived here (and in time_checks.py, the step- and compile-time lines) from the measured numbers, so a claim can
never outlive the data it was made from.

Each check returns one ``Finding`` (findings.py): a verdict (True/False, or None where it only reports numbers) and a
sentence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from findings import (
    BUDGET_SLACK,
    NONE_PEAK_SLACK,
    PER_BLOCK,
    SIM_TOLERANCE,
    Finding,
    MiB,
    budget_bytes,
    bytes_text,
    join,
    mib,
    models,
    ok_rows,
    recipe_pairs,
    row_of,
    yes,
)
from time_checks import compile_time, none_vs_plain_time, recipe_step_time, timing_spread


def within_budget(rows: list[dict[str, Any]]) -> Finding:
    """Every remat row with a budget: measured peak <= 1.05 x the budget it was planned against."""
    checked = [(r, r["measured_peak_bytes"] / budget_bytes(r)) for r in ok_rows(rows) if budget_bytes(r)]
    if not checked:
        return Finding("within_budget", None, "No remat row with a budget was measured.")
    worst_row, worst = max(checked, key=lambda item: item[1])
    over = [(r, ratio) for r, ratio in checked if ratio > BUDGET_SLACK]
    text = (
        f"remat's measured peak ≤ {BUDGET_SLACK} × budget on every remat row with a budget "
        f"(fraction rows against the plan's resolved budget in bytes): {yes(not over)} — {len(checked)} rows, "
        f"worst ratio {worst:.3f} ({worst_row['model']} `{worst_row['row']}`)"
    )
    excess_row = max((r for r, _ in checked), key=lambda r: r["measured_peak_bytes"] - budget_bytes(r))
    excess = excess_row["measured_peak_bytes"] - budget_bytes(excess_row)
    if excess > 0:
        text += f"; largest excess over the budget {bytes_text(excess)} ({excess_row['model']} `{excess_row['row']}`)"
    text += "."
    if over:
        text += " Over: " + join(_over(r, ratio) for r, ratio in over) + "."
    return Finding("within_budget", not over, text)


def _over(r: dict[str, Any], ratio: float) -> str:
    text = f"{r['model']} `{r['row']}` {ratio:.3f} × budget ({mib(r['measured_peak_bytes'] - budget_bytes(r))} over"
    if not r.get("plan_feasible", True):
        text += f"; budget infeasible, least reachable peak {mib(r['plan_least_peak_bytes'])}"
    return text + ")"


def monotone(rows: list[dict[str, Any]]) -> Finding:
    """Per model, over all remat rows with a budget: a lower budget never gives a higher measured peak."""
    parts, ok = [], True
    for model in models(rows):
        budgeted = sorted(
            (
                (budget_bytes(r), r)
                for r in ok_rows(rows)
                if r["model"] == model and budget_bytes(r) and not r.get("options")
            ),
            key=lambda item: item[0],
        )
        if len(budgeted) < 2:
            continue
        worse = [
            (lo, hi)
            for i, (b_lo, lo) in enumerate(budgeted)
            for b_hi, hi in budgeted[i + 1 :]
            if b_lo < b_hi and lo["measured_peak_bytes"] > hi["measured_peak_bytes"]
        ]
        ok = ok and not worse
        peaks = " ≥ ".join(f"{r['measured_peak_bytes'] / MiB:.1f}" for _, r in reversed(budgeted))
        parts.append(
            f"{model}: {peaks} MiB"
            + (
                ""
                if not worse
                else " — rises at "
                + join(
                    f"`{lo['row']}` ({mib(lo['measured_peak_bytes'])}) vs "
                    f"`{hi['row']}` ({mib(hi['measured_peak_bytes'])})"
                    for lo, hi in worse
                )
            )
        )
    if not parts:
        return Finding("monotone", None, "Fewer than two remat rows with a budget per model: monotonicity not checked.")
    return Finding(
        "monotone",
        ok,
        "remat's measured peak never rises as its budget (in bytes) falls: "
        f"{yes(ok)} — {join(parts)} (highest budget first).",
    )


def torch_rises(rows: list[dict[str, Any]], lo: float = 0.0, hi: float = 0.5) -> Finding:
    """torch's measured peak at activation_memory_budget ``lo`` against ``hi``."""
    parts, rises = [], []
    for model in models(rows):
        a, b = row_of(rows, model, f"torch budget {lo}"), row_of(rows, model, f"torch budget {hi}")
        if a is None or b is None:
            continue
        ratio = a["measured_peak_bytes"] / b["measured_peak_bytes"]
        rises.append(ratio > 1.0)
        parts.append(
            f"{model}: {mib(a['measured_peak_bytes'])} at {lo} vs {mib(b['measured_peak_bytes'])} at {hi} "
            f"({ratio:.2f}×)"
        )
    if not parts:
        return Finding("torch_rises", None, f"torch budget {lo} and {hi} rows not both measured.")
    n = sum(rises)
    return Finding(
        "torch_rises",
        None,
        f"torch's measured peak at activation_memory_budget {lo} vs {hi}: "
        f"{join(parts)} — higher at the lower budget on {n} of {len(parts)} models.",
    )


def grads(rows: list[dict[str, Any]], inner: str) -> Finding:
    """Gradients against eager: remat rows must be bitwise equal under aot_eager and within relative error 1e-5
    under inductor (docs/design.md, invariant 1); torch's budget rows are reported alongside."""
    remat_rows = [r for r in ok_rows(rows) if r["kind"] == "remat"]
    torch_rows = [r for r in ok_rows(rows) if r["kind"] == "torch"]
    if not remat_rows:
        return Finding("grads", None, "No remat row was measured.")
    worst = max(remat_rows, key=lambda r: (r["max_grad_diff"], r["max_grad_rel_err"]))
    tol = 0.0 if inner != "inductor" else 1e-5
    ok = all(r["max_grad_rel_err"] <= tol for r in remat_rows)
    rule = "bitwise equal" if tol == 0.0 else f"relative error ≤ {tol:g}"
    if worst["max_grad_diff"] == 0.0:
        found = "0"
    else:
        found = f"{worst['max_grad_diff']:.1e} ({worst['model']} `{worst['row']}`, rel {worst['max_grad_rel_err']:.2g})"
    text = f"remat's gradients {rule} to eager on all {len(remat_rows)} remat rows: {yes(ok)} — max grad diff {found}"
    if torch_rows:
        wrong = [r for r in torch_rows if r["max_grad_rel_err"] > tol]
        t = max(torch_rows, key=lambda r: r["max_grad_rel_err"])
        text += (
            f"; torch's budget rows: {len(wrong)} of {len(torch_rows)} outside that, worst per-parameter "
            f"relative error {t['max_grad_rel_err']:.2f} ({t['model']} `{t['row']}`)"
        )
    return Finding("grads", ok, text + ".")


def at_torch_peaks(rows: list[dict[str, Any]], budgets: Iterable[float]) -> Finding:
    """remat given torch's measured peak as its byte budget, against that torch row: peak and step time."""
    parts = []
    for model in models(rows):
        for b in budgets:
            t, r = row_of(rows, model, f"torch budget {b}"), row_of(rows, model, f"remat bytes = torch {b}")
            if t is None or r is None:
                continue
            parts.append(
                f"{model} @ torch {b}: peak {mib(r['measured_peak_bytes'])} vs "
                f"{mib(t['measured_peak_bytes'])}, step time {r['step_ms'] / t['step_ms']:.2f}× torch's"
            )
    if not parts:
        return Finding("at_torch_peaks", None, "No `remat bytes = torch b` row next to its torch row.")
    return Finding(
        "at_torch_peaks",
        None,
        f"remat with torch's measured peak as its byte budget, against that torch row: {join(parts)}.",
    )


def _peak_ratios(pairs: Iterable[tuple[str, Any, Any]], limit: float, digits: int) -> tuple[list[str], list[str]]:
    """Per (model, remat row, reference row) with both measured: the measured-peak comparison as text, and the
    models where the ratio exceeds `limit`."""
    parts, over = [], []
    for model, r, c in pairs:
        if r is None or c is None:
            continue
        ratio = r["measured_peak_bytes"] / c["measured_peak_bytes"]
        if ratio > limit:
            over.append(
                f"{model} ({mib(r['measured_peak_bytes'] - c['measured_peak_bytes'])} above, {ratio:.{digits}f}×)"
            )
        parts.append(
            f"{model}: {mib(r['measured_peak_bytes'])} vs {mib(c['measured_peak_bytes'])} ({ratio:.{digits}f}×)"
        )
    return parts, over


def _verdict(name: str, claim: str, parts: list[str], over: list[str], missing: str) -> Finding:
    if not parts:
        return Finding(name, None, missing)
    text = f"{claim}: {yes(not over)} — {join(parts)}"
    if over:
        text += f". Above on {len(over)} of {len(parts)} models: " + ", ".join(over)
    return Finding(name, not over, text + ".")


def none_vs_plain(rows: list[dict[str, Any]], inner: str) -> Finding:
    """remat with no budget against the plain compiled row: with no budget remat keeps what the inner compiler's
    own partition keeps, so its measured peak may be at most ``NONE_PEAK_SLACK`` x the plain row's."""
    pairs = [(model, row_of(rows, model, "remat None"), row_of(rows, model, inner)) for model in models(rows)]
    parts, over = _peak_ratios(pairs, NONE_PEAK_SLACK, 3)
    return _verdict(
        "none_vs_plain",
        f"`remat None` (no budget) measured peak ≤ {NONE_PEAK_SLACK} × plain `{inner}`'s on every model",
        parts,
        over,
        f"`remat None` and `{inner}` rows not both measured.",
    )


def least_vs_per_block(rows: list[dict[str, Any]]) -> Finding:
    """Per model: remat's least peak (fraction 0.0) against the per-block checkpoint row, both measured."""

    def least(model: str) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in ok_rows(rows)
                if r["model"] == model
                and r["kind"] == "remat"
                and not r.get("options")
                and r.get("budget_kind") == "fraction"
                and r["budget"] == 0.0
            ),
            None,
        )

    pairs = [(model, least(model), row_of(rows, model, PER_BLOCK)) for model in models(rows)]
    parts, over = _peak_ratios(pairs, 1.0, 2)
    return _verdict(
        "least_vs_per_block",
        f"remat's least peak (fraction 0.0) ≤ per-block checkpoint's (`{PER_BLOCK}`) measured peak on every model",
        parts,
        over,
        f"`remat fraction 0.0` and `{PER_BLOCK}` rows not both measured.",
    )


def at_recipe_peaks(rows: list[dict[str, Any]]) -> Finding:
    """remat given each hand recipe's measured peak as its byte budget: measured peak <= 1.05 x that budget, and a
    feasible plan (remat warns exactly when its plan's simulated peak exceeds the budget: ``plan_feasible``)."""
    pairs = recipe_pairs(rows)
    if not pairs:
        return Finding("at_recipe_peaks", None, "No `remat bytes = <recipe>` row next to its recipe row.")
    parts, failed = [], []
    for model, recipe, _, r in pairs:
        budget = budget_bytes(r)
        ratio = r["measured_peak_bytes"] / budget
        text = f"{model} @ {recipe}: {mib(r['measured_peak_bytes'])} at {mib(budget)} ({ratio:.3f}×)"
        why = []
        if ratio > BUDGET_SLACK:
            why.append(f"{ratio:.3f} × budget")
        if r.get("plan_feasible") is False:
            least = r.get("plan_least_peak_bytes")
            why.append("plan infeasible (warned" + (f"; least reachable peak {mib(least)})" if least else ")"))
        if why:
            failed.append(f"{model} `{r['row']}`: " + ", ".join(why))
        parts.append(text)
    text = (
        f"remat at each hand recipe's measured peak as its byte budget meets it (measured ≤ {BUDGET_SLACK} × "
        f"budget, feasible plan, no warning): {yes(not failed)} — {join(parts)}"
    )
    if failed:
        text += f". Failing {len(failed)} of {len(pairs)}: " + join(failed)
    return Finding("at_recipe_peaks", not failed, text + ".")


def least_peaks(rows: list[dict[str, Any]]) -> Finding:
    """Per model, the least measured peak each method reached."""
    parts = []
    for model in models(rows):
        best = {}
        for label, kind in (("remat", "remat"), ("torch", "torch"), ("hand recipe", "checkpoint")):
            cands = [r for r in ok_rows(rows) if r["model"] == model and r["kind"] == kind]
            if cands:
                r = min(cands, key=lambda r: r["measured_peak_bytes"])
                best[label] = f"{label} {mib(r['measured_peak_bytes'])} (`{r['row']}`)"
        if best:
            parts.append(f"{model}: " + ", ".join(best.values()))
    return Finding("least_peaks", None, "least measured peak per method: " + join(parts) + ".")


def sim_vs_measured(rows: list[dict[str, Any]]) -> Finding:
    """Every remat row with a budget, and `remat None`: |measured - simulated| peak <= ``SIM_TOLERANCE`` x the
    simulated peak. Rows that compiled to several graphs are left out (their plan figures are the last graph's)."""
    chosen = [
        r
        for r in ok_rows(rows)
        if r["kind"] == "remat"
        and r.get("plan_peak_bytes")
        and (budget_bytes(r) or (r.get("budget") is None and not r.get("options")))
    ]
    split = [r for r in chosen if r.get("plan_graphs", 1) > 1]
    pairs = [
        (r, (r["measured_peak_bytes"] - r["plan_peak_bytes"]) / r["plan_peak_bytes"])
        for r in chosen
        if r.get("plan_graphs", 1) <= 1
    ]
    if not pairs:
        return Finding("sim_vs_measured", None, "No remat plan recorded.")
    worst, dev = max(pairs, key=lambda item: abs(item[1]))
    off = [(r, d) for r, d in pairs if abs(d) > SIM_TOLERANCE]
    diff = worst["measured_peak_bytes"] - worst["plan_peak_bytes"]
    text = (
        f"measured peak within {SIM_TOLERANCE:.0%} of the simulated peak on every remat row with a budget and on "
        f"`remat None`: {yes(not off)} — {len(off)} of {len(pairs)} rows outside, largest difference "
        f"{diff / MiB:+.2f} MiB ({dev:+.1%}, {worst['model']} `{worst['row']}`)"
    )
    if off:
        text += ". Outside (measured vs simulated): " + join(f"{r['model']} `{r['row']}` {d:+.1%}" for r, d in off)
    if split:
        text += f". Not compared ({len(split)} rows compiled to several graphs): " + ", ".join(
            f"{r['model']} `{r['row']}`" for r in split
        )
    return Finding("sim_vs_measured", not off, text + ".")


def problems(rows: list[dict[str, Any]]) -> Finding:
    """Rows that failed, and remat rows whose model compiled to more than one graph."""
    failed = [f"{r['model']} `{r['row']}`: {r['error']}" for r in rows if "error" in r]
    broken = [
        f"{r['model']} `{r['row']}` ({r['plan_graphs']} graphs)" for r in ok_rows(rows) if r.get("plan_graphs", 1) > 1
    ]
    if not failed and not broken:
        return Finding("problems", True, "every row ran; every remat row compiled to one graph.")
    text = ""
    if failed:
        text += f"{len(failed)} rows failed: " + join(failed) + ". "
    if broken:
        text += "graph breaks (plan figures are the last graph's): " + join(broken) + "."
    return Finding("problems", False, text.strip())


def all_findings(
    rows: list[dict[str, Any]], inner: str, fresh_cache: bool = False, warmed_up: bool = False
) -> list[Finding]:
    """Every statement of the report's "What this shows", in order; ``inner`` names the plain compiled row;
    ``fresh_cache``, ``warmed_up``: how the run compiled (see ``compile_time``)."""
    torch_budgets = sorted({r["budget"] for r in rows if r["kind"] == "torch"}, reverse=True)
    found = [within_budget(rows), monotone(rows), sim_vs_measured(rows), grads(rows, inner)]
    if torch_budgets:
        found += [torch_rises(rows, min(torch_budgets), max(torch_budgets)), at_torch_peaks(rows, torch_budgets)]
    return found + [
        none_vs_plain(rows, inner),
        none_vs_plain_time(rows, inner),
        least_vs_per_block(rows),
        at_recipe_peaks(rows),
        recipe_step_time(rows),
        compile_time(rows, inner, fresh_cache, warmed_up),
        least_peaks(rows),
        timing_spread(rows),
        problems(rows),
    ]
