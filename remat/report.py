"""Plan reports in words: the decision table, records, a one-paragraph summary, decisions by module.

Pure formatting of a Plan's decisions; every total printed here is summed from the rows printed, so a reader can
check the table against itself. The units and the table layout come from remat.units, which planning uses too.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import torch

from .annotate import Action
from .plan.plan import KEPT, Decision, Plan
from .runtime.table import MOVES
from .units import fmt_bytes, fmt_flops, render_table, short_op

TOP_LEVEL = "(top level)"  # how module_table names ops that run outside any submodule (path "")


@dataclasses.dataclass(frozen=True)
class Totals:
    """Sums over decision rows: what the table's totals line prints."""

    saved_bytes: int  # device bytes the SAVE rows and the moved rows (OFFLOAD, SHARD) keep from forward to backward
    recompute_flops: int  # recompute cost of the RECOMPUTE rows
    saved: int  # number of SAVE and moved rows
    recomputed_ops: int  # RECOMPUTE rows that cost flops (views and getitems are free re-labellings)
    moved: tuple[tuple[str, int], ...] = ()  # (how reports say the move, "offloaded"; its rows) per move with rows
    transfer_bytes: int = 0  # bytes the moved rows move off the device


def totals(decisions: Iterable[Decision]) -> Totals:
    decisions = list(decisions)
    saved = [d for d in decisions if d.action in KEPT]
    moves = {Action(action): move for action, move in MOVES.items()}
    moved = [d for d in decisions if d.action in moves]
    recomputed = [d for d in decisions if d.action is Action.RECOMPUTE]
    return Totals(
        saved_bytes=sum(d.kept for d in saved),
        recompute_flops=sum(d.cost for d in recomputed),
        saved=len(saved),
        recomputed_ops=sum(1 for d in recomputed if d.cost > 0),
        moved=tuple(
            (move.participle, count)
            for action, move in moves.items()
            if (count := sum(1 for d in moved if d.action is action))
        ),
        transfer_bytes=sum(d.nbytes - d.kept for d in moved),
    )


def records(plan: Plan) -> list[dict]:
    """One dict per decision, plain python values only (str, int, list): `pandas.DataFrame(plan.to_records())`."""
    return [
        {
            "node": d.name,
            "op": d.op,
            "module_path": d.module_path,
            "shape": [int(s) for s in d.shape],
            "dtype": d.dtype,
            "bytes": int(d.nbytes),
            "kept_bytes": int(d.kept),
            "recompute_flops": int(d.cost),
            "action": d.action.value,
            "reason": d.reason,
        }
        for d in plan.decisions
    ]


def table(plan: Plan, max_rows: int | None = None) -> str:
    """One row per decision (the first `max_rows` when given), then totals over all rows against the baseline. The
    module column is the path of the module whose forward made the value ("(top level)" outside any submodule)."""
    head = ("node", "op", "module", "shape", "dtype", "bytes", "recompute cost", "action", "reason")
    rows = [
        (
            d.name,
            d.op,
            d.module_path or TOP_LEVEL,
            "x".join(map(str, d.shape)),
            d.dtype,
            fmt_bytes(d.nbytes),
            fmt_flops(d.cost),
            d.action.value,
            d.reason,
        )
        for d in plan.decisions
    ]
    hidden = 0
    if max_rows is not None and len(rows) > max_rows:
        hidden, rows = len(rows) - max_rows, rows[:max_rows]
    lines = render_table([head, *rows])
    if hidden:
        lines.append(f"... {hidden} more rows (totals below count them)")
    lines.extend(totals_lines(plan))
    return "\n".join(lines)


def totals_lines(plan: Plan) -> list[str]:
    t = totals(plan.decisions)
    budget = "none" if plan.budget_bytes is None else fmt_bytes(plan.budget_bytes)
    lines = [
        f"total: save {t.saved} values{_moved(t)}, {fmt_bytes(t.saved_bytes)} ({t.saved_bytes} bytes; "
        f"baseline {fmt_bytes(plan.baseline.saved_bytes)}); "
        f"recompute {t.recomputed_ops} ops, {fmt_flops(t.recompute_flops)} ({t.recompute_flops} flops"
        f"{_overhead(t.recompute_flops, plan.forward_flops)})",
        f"peak {fmt_bytes(plan.peak_bytes)} ({plan.peak_bytes} bytes; baseline {fmt_bytes(plan.baseline.peak_bytes)}; "
        f"budget {budget}{'' if plan.feasible else ', not reachable'}); solver {plan.solver}",
    ]
    # The rows list tensor activations only; say so if the plan counted anything they leave out.
    if t.saved_bytes != plan.saved_bytes or t.recompute_flops != plan.recompute_flops:
        lines.append(
            f"note: the plan counts {plan.saved_bytes} saved bytes and {plan.recompute_flops} recompute flops; "
            f"the difference is in values not listed (symbolic sizes, views of inputs)"
        )
    return lines


def _moved(t: Totals) -> str:
    parts = [f"{count} {participle}" for participle, count in t.moved]
    return f" ({', '.join(parts)}: {fmt_bytes(t.transfer_bytes)} off the device)" if parts else ""


def _overhead(flops: int, forward_flops: int) -> str:
    return f", +{100 * flops / forward_flops:.1f}% of forward flops" if forward_flops > 0 else ""


def is_pointwise(op: str) -> bool:
    parts = op.split(".")
    if len(parts) != 3:
        return False
    try:
        overload = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return False
    return torch.Tag.pointwise in getattr(overload, "tags", ())


def _counted(names: Sequence[str]) -> list[tuple[str, int]]:
    """(name, count) in order of first appearance."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return list(counts.items())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def recompute_phrase(decisions: Iterable[Decision]) -> str:
    """ "12 pointwise ops and 1 mm": the RECOMPUTE rows that cost flops, pointwise ops counted together."""
    ops = [d.op for d in decisions if d.action is Action.RECOMPUTE and d.cost > 0]
    pointwise = sum(1 for op in ops if is_pointwise(op))
    parts = [_plural(pointwise, "pointwise op")] if pointwise else []
    parts += [f"{n} {name}" for name, n in _counted([short_op(op) for op in ops if not is_pointwise(op)])]
    if not parts:
        return "nothing"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def summary(plan: Plan) -> str:
    t = totals(plan.decisions)
    saves = f"saves {fmt_bytes(t.saved_bytes)} of {fmt_bytes(plan.baseline.saved_bytes)}"
    if plan.budget_bytes is None:
        recomputes = recompute_phrase(plan.decisions)
        if recomputes != "nothing":
            recomputes += f" ({fmt_flops(t.recompute_flops)}{_overhead(t.recompute_flops, plan.forward_flops)})"
        return (
            f"no memory_budget: the {plan.baseline.kind}: {saves}; recomputes {recomputes}; "
            f"peak {fmt_bytes(plan.peak_bytes)}"
        )
    text = (
        f"{saves}; recomputes {recompute_phrase(plan.decisions)} "
        f"({fmt_flops(t.recompute_flops)}{_overhead(t.recompute_flops, plan.forward_flops)}); "
        f"peak {fmt_bytes(plan.peak_bytes)} of budget {fmt_bytes(plan.budget_bytes)} "
        f"(baseline peak {fmt_bytes(plan.baseline.peak_bytes)}); solver {plan.solver}"
    )
    if not plan.feasible:
        least = plan.least_peak_bytes if plan.least_peak_bytes is not None else plan.peak_bytes
        text += f"; the budget cannot be met: the least reachable peak is {fmt_bytes(least)}"
    if plan.step_share is not None and plan.step_share.shared:
        text += f"; {plan.step_share.note()}"
    return text


def module_key(path: str, depth: int | None) -> str:
    """`path` cut to its first `depth` dotted parts ("blocks.1.attn.attn_drop", 3 → "blocks.1.attn")."""
    if depth is None or not path:
        return path
    return ".".join(path.split(".")[:depth])


def by_module(decisions: Iterable[Decision], depth: int | None = None) -> dict[str, list[Decision]]:
    """Decisions grouped by module path (cut to `depth` parts), keys in order of first appearance."""
    groups: dict[str, list[Decision]] = {}
    for d in decisions:
        groups.setdefault(module_key(d.module_path, depth), []).append(d)
    return groups


def _label(d: Decision) -> str:
    return short_op(d.source_op or d.op)


def _ops(decisions: Sequence[Decision]) -> str:
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in _counted([_label(d) for d in decisions]))


def module_table(plan: Plan, depth: int | None = None) -> str:
    """One line per module: "blocks.1.attn: recompute softmax, bmm x2; save native_dropout x2".

    Listed are the recomputed ops that cost flops and the saved values that hold bytes; views, getitems of a
    recomputed tuple and sizes are free re-labellings and left out. A module with nothing listed has no line.
    """
    lines = []
    for path, group in by_module(plan.decisions, depth).items():
        listed = [(Action.RECOMPUTE, [d for d in group if d.action is Action.RECOMPUTE and d.cost > 0])]
        listed += [(a, [d for d in group if d.action is a and d.nbytes > 0]) for a in KEPT]
        parts = [f"{action.value} {_ops(ds)}" for action, ds in listed if ds]
        if parts:
            lines.append(f"{path or TOP_LEVEL}: " + "; ".join(parts))
    return "\n".join(lines)
