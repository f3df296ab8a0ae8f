"""Profile marks in the backward module: a timestamp pair around every run of recomputation and of a move's backward
chain that is not one timed remat op (a sharded value's gather; runtime/table.py's Move.marked)."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..plan.problem import Problem, Resolved
from ..runtime.table import MARK as MARK_OP
from ..runtime.table import MOVES, RECOMPUTE, target
from .marks import MARK, recomputed

# Profile key → the op whose results a run of its backward chain counts (the all_gather, not the wait, slice and
# view after it, which hand the same bytes on).
_CHAINS = {move.profile: target(move.backward[0][0]) for move in MOVES.values() if move.marked}


def mark_recomputation(bw: fx.GraphModule, problem: Problem, resolved: Resolved, profile_id: int) -> None:
    """Insert `remat::mark` before and after each maximal run of recomputed nodes (and of a marked chain's nodes)."""
    nodes = [n for n in bw.graph.nodes if n.op == "call_function"]
    runs: list[tuple[str, list[fx.Node]]] = []
    for node in nodes:
        kind = _kind(node, resolved)
        if kind is None:
            continue
        if runs and runs[-1][0] == kind and runs[-1][1][-1].next is node:
            runs[-1][1].append(node)
        else:
            runs.append((kind, [node]))
    fallback = next((n for n in bw.graph.nodes if n.op == "placeholder" and _tensor(n)), None)
    for number, (kind, run) in enumerate(runs):
        begin = _device_anchor(run[0]) or fallback
        end = _tensor(run[-1]) or begin
        if begin is None:
            continue
        nbytes = sum(_bytes(n) for n in run if kind == RECOMPUTE or n.target is _CHAINS[kind])
        label = f"{kind}{number}"
        with bw.graph.inserting_before(run[0]):
            bw.graph.call_function(MARK_OP.overload, (begin, profile_id, label, kind, nbytes, True))
        with bw.graph.inserting_after(run[-1]):
            bw.graph.call_function(MARK_OP.overload, (end, profile_id, label, kind, nbytes, False))
    bw.graph.lint()
    bw.recompile()


def _kind(node: fx.Node, resolved: Resolved) -> str | None:
    added = node.meta.get(MARK, ("", ""))[0]
    if added in _CHAINS:
        return added
    if recomputed(node, resolved.recomputed):
        return RECOMPUTE
    return None


def _tensor(node: fx.Node) -> fx.Node | None:
    return node if isinstance(node.meta.get("val"), torch.Tensor) else None


def _device_anchor(node: fx.Node) -> fx.Node | None:
    return next((a for a in node.all_input_nodes if _tensor(a)), None)


def _bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def mark_step(fw: fx.GraphModule, profile_id: int) -> None:
    """Open a new step record when the forward starts."""
    anchor = next((n for n in fw.graph.nodes if n.op == "placeholder" and _tensor(n)), None)
    first = next((n for n in fw.graph.nodes if n.op != "placeholder"), None)
    if anchor is None or first is None:
        return
    with fw.graph.inserting_before(first):
        fw.graph.call_function(MARK_OP.overload, (anchor, profile_id, "step", "step", 0, True))
    fw.recompile()
