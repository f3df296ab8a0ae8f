"""The report's time lines, computed from a run's rows: remat None's step time against the plain compiled row's,
remat's at each hand recipe's peak against the recipe's, the first step (compilation included) against the plain
row's, and how much a row's timed steps vary."""

from __future__ import annotations

from typing import Any

from findings import Finding, join, models, ok_rows, recipe_pairs, row_of, yes


NONE_TIME_SLACK = 1.03
"""`remat None` against the plain compiled row: its step time may exceed that row's by this factor."""
COMPILE_SLACK = 1.5
"""A remat row's first step (compilation included) may take this many times the plain compiled row's."""


def none_vs_plain_time(rows: list[dict[str, Any]], inner: str) -> Finding:
    """remat with no budget against the plain compiled row: step time at most ``NONE_TIME_SLACK`` x the plain
    row's (same run). Where the run timed the two in alternation (the row's ``paired``, pairs.py) that ratio (the
    median per-round ratio) is the one held to the limit, given with the plain row timed against a second build
    of itself (the run's noise); else the separate stretches', each comparison over it giving the two rows' own
    step-time spread."""
    parts, over = [], []
    for model in models(rows):
        r, c = row_of(rows, model, "remat None"), row_of(rows, model, inner)
        if r is None or c is None:
            continue
        ratio, text, times = _time_ratio(r, c, NONE_TIME_SLACK)
        if ratio > NONE_TIME_SLACK:
            over.append(f"{model} {text}")
        parts.append(f"{model}: {times} ({ratio:.2f}×)")
    if not parts:
        return Finding("none_vs_plain_time", None, f"`remat None` and `{inner}` rows not both measured.")
    text = (
        f"`remat None` step time ≤ {NONE_TIME_SLACK} × plain `{inner}`'s on every model: {yes(not over)} — "
        f"{join(parts)}"
    )
    if over:
        text += f". Slower on {len(over)} of {len(parts)} models: " + join(over)
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


def recipe_step_time(rows: list[dict[str, Any]]) -> Finding:
    """remat at each hand recipe's measured peak against that recipe row: step time no higher than the recipe's."""
    pairs = recipe_pairs(rows)
    if not pairs:
        return Finding("recipe_step_time", None, "No `remat bytes = <recipe>` row next to its recipe row.")
    parts, slower = [], []
    for model, recipe, c, r in pairs:
        ratio, text, _ = _time_ratio(r, c, 1.0)
        parts.append(f"{model} @ {recipe}: {ratio:.2f}×" + (" in alternation" if "quartiles" in text else ""))
        if ratio > 1.0:
            slower.append(f"{model} `{r['row']}` {text}")
    text = (
        f"remat at each hand recipe's measured peak steps no slower than that recipe: {yes(not slower)} — "
        f"step time over the recipe's: {join(parts)}"
    )
    if slower:
        text += f". Slower on {len(slower)} of {len(pairs)}: " + join(slower)
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
    for model in models(rows):
        c = row_of(rows, model, inner)
        timed = [r for r in ok_rows(rows) if r["model"] == model and r["kind"] == "remat" and "first_step_s" in r]
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
        none = row_of(rows, model, "remat None")
        if none is not None and "first_step_s" in none:
            nones.append((model, none["first_step_s"], c["first_step_s"]))
    if not parts:
        return Finding("compile_time", None, f"No remat row with its first-step time next to a `{inner}` row.")
    text = (
        f"remat's first step (compilation included) ≤ {COMPILE_SLACK} × plain `{inner}`'s on every model: "
        f"{yes(not over)} — slowest remat row per model: {join(parts)}"
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


def timing_spread(rows: list[dict[str, Any]]) -> Finding:
    """How much the timed steps of one row vary: (slowest - fastest) / median, over the rows."""
    spreads = sorted(
        (
            ((max(r["step_ms_all"]) - min(r["step_ms_all"])) / r["step_ms"], r)
            for r in ok_rows(rows)
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
