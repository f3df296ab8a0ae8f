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
SIM_TOLERANCE = 0.05
"""|measured - simulated| peak may be at most this fraction of the simulated peak."""
NONE_PEAK_SLACK = 1.02
NONE_TIME_SLACK = 1.03
"""`remat None` against the plain compiled row: measured peak and step time may exceed its by these factors."""
COMPILE_SLACK = 1.5
"""A remat row's first step (compilation included) may take this many times the plain compiled row's."""
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
    checked = [(r, r["measured_peak_bytes"] / budget_bytes(r)) for r in _ok(rows) if budget_bytes(r)]
    if not checked:
        return Finding("within_budget", None, "No remat row with a budget was measured.")
    worst_row, worst = max(checked, key=lambda item: item[1])
    over = [(r, ratio) for r, ratio in checked if ratio > BUDGET_SLACK]
    text = (
        f"remat's measured peak ≤ {BUDGET_SLACK} × budget on every remat row with a budget "
        f"(fraction rows against the plan's resolved budget in bytes): {_yes(not over)} — {len(checked)} rows, "
        f"worst ratio {worst:.3f} ({worst_row['model']} `{worst_row['row']}`)"
    )
    excess_row = max((r for r, _ in checked), key=lambda r: r["measured_peak_bytes"] - budget_bytes(r))
    excess = excess_row["measured_peak_bytes"] - budget_bytes(excess_row)
    if excess > 0:
        text += f"; largest excess over the budget {_bytes(excess)} ({excess_row['model']} `{excess_row['row']}`)"
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
        budgeted = sorted(
            (
                (budget_bytes(r), r)
                for r in _ok(rows)
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
                + _join(
                    f"`{lo['row']}` ({_mib(lo['measured_peak_bytes'])}) vs "
                    f"`{hi['row']}` ({_mib(hi['measured_peak_bytes'])})"
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
        f"{_yes(ok)} — {_join(parts)} (highest budget first).",
    )


def torch_rises(rows: list[dict[str, Any]], lo: float = 0.0, hi: float = 0.5) -> Finding:
    """torch's measured peak at activation_memory_budget ``lo`` against ``hi``."""
    parts, rises = [], []
    for model in _models(rows):
        a, b = _row(rows, model, f"torch budget {lo}"), _row(rows, model, f"torch budget {hi}")
        if a is None or b is None:
            continue
        ratio = a["measured_peak_bytes"] / b["measured_peak_bytes"]
        rises.append(ratio > 1.0)
        parts.append(
            f"{model}: {_mib(a['measured_peak_bytes'])} at {lo} vs {_mib(b['measured_peak_bytes'])} at {hi} "
            f"({ratio:.2f}×)"
        )
    if not parts:
        return Finding("torch_rises", None, f"torch budget {lo} and {hi} rows not both measured.")
    n = sum(rises)
    return Finding(
        "torch_rises",
        None,
        f"torch's measured peak at activation_memory_budget {lo} vs {hi}: "
        f"{_join(parts)} — higher at the lower budget on {n} of {len(parts)} models.",
    )


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
        found = f"{worst['max_grad_diff']:.1e} ({worst['model']} `{worst['row']}`, rel {worst['max_grad_rel_err']:.2g})"
    text = f"remat's gradients {rule} to eager on all {len(remat_rows)} remat rows: {_yes(ok)} — max grad diff {found}"
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
    for model in _models(rows):
        for b in budgets:
            t, r = _row(rows, model, f"torch budget {b}"), _row(rows, model, f"remat bytes = torch {b}")
            if t is None or r is None:
                continue
            parts.append(
                f"{model} @ torch {b}: peak {_mib(r['measured_peak_bytes'])} vs "
                f"{_mib(t['measured_peak_bytes'])}, step time {r['step_ms'] / t['step_ms']:.2f}× torch's"
            )
    if not parts:
        return Finding("at_torch_peaks", None, "No `remat bytes = torch b` row next to its torch row.")
    return Finding(
        "at_torch_peaks",
        None,
        f"remat with torch's measured peak as its byte budget, against that torch row: {_join(parts)}.",
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
                f"{model} ({_mib(r['measured_peak_bytes'] - c['measured_peak_bytes'])} above, {ratio:.{digits}f}×)"
            )
        parts.append(
            f"{model}: {_mib(r['measured_peak_bytes'])} vs {_mib(c['measured_peak_bytes'])} ({ratio:.{digits}f}×)"
        )
    return parts, over


def _verdict(name: str, claim: str, parts: list[str], over: list[str], missing: str) -> Finding:
    if not parts:
        return Finding(name, None, missing)
    text = f"{claim}: {_yes(not over)} — {_join(parts)}"
    if over:
        text += f". Above on {len(over)} of {len(parts)} models: " + ", ".join(over)
    return Finding(name, not over, text + ".")


def none_vs_plain(rows: list[dict[str, Any]], inner: str) -> Finding:
    """remat with no budget against the plain compiled row: with no budget remat keeps what the inner compiler's
    own partition keeps, so its measured peak may be at most ``NONE_PEAK_SLACK`` x the plain row's."""
    pairs = [(model, _row(rows, model, "remat None"), _row(rows, model, inner)) for model in _models(rows)]
    parts, over = _peak_ratios(pairs, NONE_PEAK_SLACK, 3)
    return _verdict(
        "none_vs_plain",
        f"`remat None` (no budget) measured peak ≤ {NONE_PEAK_SLACK} × plain `{inner}`'s on every model",
        parts,
        over,
        f"`remat None` and `{inner}` rows not both measured.",
    )


def none_vs_plain_time(rows: list[dict[str, Any]], inner: str) -> Finding:
    """remat with no budget against the plain compiled row: step time at most ``NONE_TIME_SLACK`` x the plain
    row's (same run). Where the run timed the two in alternation (the row's ``paired``, pairs.py) that ratio (the
    median per-round ratio) is the one held to the limit, given with the plain row timed against a second build
    of itself (the run's noise); else the separate stretches', each comparison over it giving the two rows' own
    step-time spread."""
    parts, over = [], []
    for model in _models(rows):
        r, c = _row(rows, model, "remat None"), _row(rows, model, inner)
        if r is None or c is None:
            continue
        ratio, text, times = _time_ratio(r, c, NONE_TIME_SLACK)
        if ratio > NONE_TIME_SLACK:
            over.append(f"{model} {text}")
        parts.append(f"{model}: {times} ({ratio:.2f}×)")
    if not parts:
        return Finding("none_vs_plain_time", None, f"`remat None` and `{inner}` rows not both measured.")
    text = (
        f"`remat None` step time ≤ {NONE_TIME_SLACK} × plain `{inner}`'s on every model: {_yes(not over)} — "
        f"{_join(parts)}"
    )
    if over:
        text += f". Slower on {len(over)} of {len(parts)} models: " + _join(over)
    return Finding("none_vs_plain_time", not over, text + ".")


def _spread(r: dict[str, Any]) -> float | None:
    """(slowest - fastest) / median of the row's timed steps; None with one timed step."""
    times = r.get("step_ms_all") or ()
    return (max(times) - min(times)) / r["step_ms"] if len(times) > 1 else None


def _time_ratio(r: dict[str, Any], ref: dict[str, Any], limit: float) -> tuple[float, str, str]:
    """``r``'s step time over ``ref``'s, that ratio as text, and the two times as text. From ``r``'s ``paired``
    timing when it was taken against ``ref`` (the text then gives the per-round ratios' quartiles), else from the
    two rows' own stretches: above ``limit`` the text then adds the larger of the two rows' own spreads and
    whether the excess over ``limit`` is within it."""
    paired = r.get("paired")
    if paired and paired.get("against") == ref["row"]:
        ratio = paired["ratio"]
        low, high = paired["round_ratio_quartiles"]
        times = f"{paired['step_ms']:.1f} vs {paired['against_step_ms']:.1f} ms"
        if "ratio_of_medians" not in paired:  # a run from before the median per-round ratio was the one held
            times += f", timed in alternation over {paired['rounds']} rounds"
        else:
            times += (
                f" (medians; their ratio {paired['ratio_of_medians']:.2f}×), timed in alternation over "
                f"{paired['rounds']} rounds"
            )
            control = paired.get("plain_vs_itself")
            if control:
                c_low, c_high = control["round_ratio_quartiles"]
                times += (
                    f"; `{ref['row']}` against a second build of itself {control['ratio']:.2f}× (quartiles "
                    f"{c_low:.2f}-{c_high:.2f})"
                )
            times += "; median per-round ratio"
        return ratio, f"{ratio:.2f}× (per-round ratios' quartiles {low:.2f}-{high:.2f})", times
    ratio = r["step_ms"] / ref["step_ms"]
    text = f"{ratio:.2f}×"
    spreads = [s for s in (_spread(r), _spread(ref)) if s is not None]
    if ratio > limit and spreads:
        noise = max(spreads)
        text += (
            f" (the two rows' own step-time spread is up to {noise:.0%}: the excess is "
            f"{'within' if ratio - limit <= noise else 'beyond'} it)"
        )
    return ratio, text, f"{r['step_ms']:.1f} vs {ref['step_ms']:.1f} ms"


def least_vs_per_block(rows: list[dict[str, Any]]) -> Finding:
    """Per model: remat's least peak (fraction 0.0) against the per-block checkpoint row, both measured."""

    def least(model: str) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in _ok(rows)
                if r["model"] == model
                and r["kind"] == "remat"
                and not r.get("options")
                and r.get("budget_kind") == "fraction"
                and r["budget"] == 0.0
            ),
            None,
        )

    pairs = [(model, least(model), _row(rows, model, PER_BLOCK)) for model in _models(rows)]
    parts, over = _peak_ratios(pairs, 1.0, 2)
    return _verdict(
        "least_vs_per_block",
        f"remat's least peak (fraction 0.0) ≤ per-block checkpoint's (`{PER_BLOCK}`) measured peak on every model",
        parts,
        over,
        f"`remat fraction 0.0` and `{PER_BLOCK}` rows not both measured.",
    )


def _recipe_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(model, recipe, recipe row, remat row at that recipe's measured peak) for every pair measured."""
    pairs = []
    for model in _models(rows):
        for name, recipe in RECIPE_ROWS:
            c, r = _row(rows, model, name), _row(rows, model, f"remat bytes = {recipe}")
            if c is not None and r is not None and budget_bytes(r):
                pairs.append((model, recipe, c, r))
    return pairs


def at_recipe_peaks(rows: list[dict[str, Any]]) -> Finding:
    """remat given each hand recipe's measured peak as its byte budget: measured peak <= 1.05 x that budget, and a
    feasible plan (remat warns exactly when its plan's simulated peak exceeds the budget: ``plan_feasible``)."""
    pairs = _recipe_pairs(rows)
    if not pairs:
        return Finding("at_recipe_peaks", None, "No `remat bytes = <recipe>` row next to its recipe row.")
    parts, failed = [], []
    for model, recipe, _, r in pairs:
        budget = budget_bytes(r)
        ratio = r["measured_peak_bytes"] / budget
        text = f"{model} @ {recipe}: {_mib(r['measured_peak_bytes'])} at {_mib(budget)} ({ratio:.3f}×)"
        why = []
        if ratio > BUDGET_SLACK:
            why.append(f"{ratio:.3f} × budget")
        if r.get("plan_feasible") is False:
            least = r.get("plan_least_peak_bytes")
            why.append("plan infeasible (warned" + (f"; least reachable peak {_mib(least)})" if least else ")"))
        if why:
            failed.append(f"{model} `{r['row']}`: " + ", ".join(why))
        parts.append(text)
    text = (
        f"remat at each hand recipe's measured peak as its byte budget meets it (measured ≤ {BUDGET_SLACK} × "
        f"budget, feasible plan, no warning): {_yes(not failed)} — {_join(parts)}"
    )
    if failed:
        text += f". Failing {len(failed)} of {len(pairs)}: " + _join(failed)
    return Finding("at_recipe_peaks", not failed, text + ".")


def recipe_step_time(rows: list[dict[str, Any]]) -> Finding:
    """remat at each hand recipe's measured peak against that recipe row: step time no higher than the recipe's."""
    pairs = _recipe_pairs(rows)
    if not pairs:
        return Finding("recipe_step_time", None, "No `remat bytes = <recipe>` row next to its recipe row.")
    parts, slower = [], []
    for model, recipe, c, r in pairs:
        ratio, text, _ = _time_ratio(r, c, 1.0)
        parts.append(f"{model} @ {recipe}: {ratio:.2f}×" + (" in alternation" if "quartiles" in text else ""))
        if ratio > 1.0:
            slower.append(f"{model} `{r['row']}` {text}")
    text = (
        f"remat at each hand recipe's measured peak steps no slower than that recipe: {_yes(not slower)} — "
        f"step time over the recipe's: {_join(parts)}"
    )
    if slower:
        text += f". Slower on {len(slower)} of {len(pairs)}: " + _join(slower)
    return Finding("recipe_step_time", not slower, text + ".")


def compile_time(rows: list[dict[str, Any]], inner: str, fresh_cache: bool = False, warmed_up: bool = False) -> Finding:
    """Per model, remat's slowest first step (compilation included) against the plain compiled row's: from a
    row's ``compile_recheck`` where the run re-timed it (compile_time.recheck), else from the two single first
    steps.

    ``fresh_cache``: the run compiled every row with an empty inductor cache (``rows.row_context``). Without it,
    inductor rows shared inductor's kernel caches, and the text says so. ``warmed_up``: the run compiled a small
    function before its first row (``rows.warm_up_compiler``); without it the first compiled row also paid the
    process's one-time compiler start-up, and the text says so.
    """
    parts, over, nones, first, retimed = [], [], [], True, False
    for model in _models(rows):
        c = _row(rows, model, inner)
        timed = [r for r in _ok(rows) if r["model"] == model and r["kind"] == "remat" and "first_step_s" in r]
        if c is None or not timed or not c.get("first_step_s"):
            continue

        def ratio_of(r: dict[str, Any]) -> float:
            again = r.get("compile_recheck")
            return again["ratio"] if again else r["first_step_s"] / c["first_step_s"]

        worst = max(timed, key=ratio_of)
        n_over = sum(ratio_of(r) > COMPILE_SLACK for r in timed)
        if n_over:
            over.append(f"{model} ({n_over} of {len(timed)} remat rows)")
        again = worst.get("compile_recheck")
        if again:
            retimed = True
            parts.append(
                f"{model}: `{worst['row']}` {again['seconds']:.1f} s vs {again['plain_seconds']:.1f} s re-timed "
                f"({again['ratio']:.2f}×; its single first step {worst['first_step_s']:.1f} vs "
                f"{c['first_step_s']:.1f} s)"
            )
        else:
            parts.append(
                f"{model}: `{worst['row']}` {worst['first_step_s']:.1f} s vs {c['first_step_s']:.1f} s "
                f"({ratio_of(worst):.2f}×)"
            )
        first = first and all(rows.index(c) < rows.index(r) for r in timed)
        none = _row(rows, model, "remat None")
        if none is not None and "first_step_s" in none:
            nones.append((model, none["first_step_s"], c["first_step_s"]))
    if not parts:
        return Finding("compile_time", None, f"No remat row with its first-step time next to a `{inner}` row.")
    text = (
        f"remat's first step (compilation included) ≤ {COMPILE_SLACK} × plain `{inner}`'s on every model: "
        f"{_yes(not over)} — slowest remat row per model: {_join(parts)}"
    )
    if over:
        text += ". Over on " + ", ".join(over)
    text += ". Measured as the wall time of each row's first call (one step's run included)"
    if retimed:
        rounds = next(r["compile_recheck"]["rounds"] for r in rows if r.get("compile_recheck"))
        text += (
            "; the slowest remat row of each model and any over the limit were then re-timed against plain "
            f"`{inner}` ({rounds} rounds in turn, each run a fresh process with an empty inductor cache and the "
            "default thread counts, the first call's wall time, medians of the rounds; compile_time.recheck), and "
            "where a row was re-timed that ratio is the one held"
        )
    if (
        not warmed_up
        and rows
        and next((r for r in rows if r["kind"] in ("compiled", "torch", "remat")), {}).get("kind") == "compiled"
    ):
        text += (
            "; the plain row was this run's first compile, so its time also holds the process's one-time "
            "compiler start-up"
        )
    if inner == "inductor" and not fresh_cache:
        text += (
            "; in this run the compiled rows shared inductor's kernel caches (in process and on disk, keyed "
            "by the kernel's source; only the FX graph cache was off), so a row could reuse kernels an earlier "
            "row built"
        )
        if first:
            text += (
                ", and the plain row ran before every remat row of its model: remat rows could reuse its "
                "kernels, it could not reuse theirs"
            )
        faster = [f"{m} {n:.1f} s vs {p:.1f} s" for m, n, p in nones if n < p]
        if faster:
            text += (
                "; `remat None` plans and then compiles with the same inner compiler, yet its first step took "
                "less than the plain row's on " + ", ".join(faster) + ": the plain row's time holds kernel "
                "builds that later rows could skip, so these ratios do not compare compile times from equal "
                "caches"
            )
    elif inner == "inductor":
        text += "; every compiled row compiled with an empty inductor cache, so each built all of its own kernels"
    return Finding("compile_time", not over, text + ".")


def least_peaks(rows: list[dict[str, Any]]) -> Finding:
    """Per model, the least measured peak each method reached."""
    parts = []
    for model in _models(rows):
        best = {}
        for label, kind in (("remat", "remat"), ("torch", "torch"), ("hand recipe", "checkpoint")):
            cands = [r for r in _ok(rows) if r["model"] == model and r["kind"] == kind]
            if cands:
                r = min(cands, key=lambda r: r["measured_peak_bytes"])
                best[label] = f"{label} {_mib(r['measured_peak_bytes'])} (`{r['row']}`)"
        if best:
            parts.append(f"{model}: " + ", ".join(best.values()))
    return Finding("least_peaks", None, "least measured peak per method: " + _join(parts) + ".")


def sim_vs_measured(rows: list[dict[str, Any]]) -> Finding:
    """Every remat row with a budget, and `remat None`: |measured - simulated| peak <= ``SIM_TOLERANCE`` x the
    simulated peak. Rows that compiled to several graphs are left out (their plan figures are the last graph's)."""
    chosen = [
        r
        for r in _ok(rows)
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
        f"`remat None`: {_yes(not off)} — {len(off)} of {len(pairs)} rows outside, largest difference "
        f"{diff / MiB:+.2f} MiB ({dev:+.1%}, {worst['model']} `{worst['row']}`)"
    )
    if off:
        text += ". Outside (measured vs simulated): " + _join(f"{r['model']} `{r['row']}` {d:+.1%}" for r, d in off)
    if split:
        text += f". Not compared ({len(split)} rows compiled to several graphs): " + ", ".join(
            f"{r['model']} `{r['row']}`" for r in split
        )
    return Finding("sim_vs_measured", not off, text + ".")


def problems(rows: list[dict[str, Any]]) -> Finding:
    """Rows that failed, and remat rows whose model compiled to more than one graph."""
    failed = [f"{r['model']} `{r['row']}`: {r['error']}" for r in rows if "error" in r]
    broken = [
        f"{r['model']} `{r['row']}` ({r['plan_graphs']} graphs)" for r in _ok(rows) if r.get("plan_graphs", 1) > 1
    ]
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
    spreads = sorted(
        (
            ((max(r["step_ms_all"]) - min(r["step_ms_all"])) / r["step_ms"], r)
            for r in _ok(rows)
            if len(r.get("step_ms_all", ())) > 1
        ),
        key=lambda item: item[0],
    )
    if not spreads:
        return Finding("timing_spread", None, "one timed step per row: no spread to report.")
    median = spreads[len(spreads) // 2][0]
    worst, r = spreads[-1]
    return Finding(
        "timing_spread",
        None,
        f"timing noise: (slowest - fastest) / median of a row's timed steps is "
        f"{median:.0%} on the median row, {worst:.0%} at most ({r['model']} `{r['row']}`); step-time "
        "differences smaller than that are within this run's noise.",
    )


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
