"""Profile marks in the backward module: a timestamp pair around every run of recomputation and every gather."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..plan.problem import Problem, Resolved
from .marks import MARK


def mark_recomputation(bw: fx.GraphModule, problem: Problem, resolved: Resolved, profile_id: int) -> None:
    """Insert `remat::mark` before and after each maximal run of recomputed nodes (and of gather nodes)."""
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
        # a gather moves what its all_gathers return; the wait, slice and view after each hand the same bytes on
        nbytes = sum(_bytes(n) for n in run if kind != "gather" or n.target in _GATHERS)
        label = f"{kind}{number}"
        with bw.graph.inserting_before(run[0]):
            bw.graph.call_function(torch.ops.remat.mark.default, (begin, profile_id, label, kind, nbytes, True))
        with bw.graph.inserting_after(run[-1]):
            bw.graph.call_function(torch.ops.remat.mark.default, (end, profile_id, label, kind, nbytes, False))
    bw.graph.lint()
    bw.recompile()


def _kind(node: fx.Node, resolved: Resolved) -> str | None:
    added = node.meta.get(MARK, ("", ""))[0]
    if added == "gather":
        return "gather"
    if node.name in resolved.recomputed or added == "replay":
        return "recompute"
    return None


def _tensor(node: fx.Node) -> fx.Node | None:
    return node if isinstance(node.meta.get("val"), torch.Tensor) else None


_GATHERS = (torch.ops._c10d_functional.all_gather_into_tensor.default,)


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
        fw.graph.call_function(torch.ops.remat.mark.default, (anchor, profile_id, "step", "step", 0, True))
    fw.recompile()
