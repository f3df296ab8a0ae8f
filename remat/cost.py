"""Recompute cost of every node, in one unit: flops.

Compute-bound ops are counted with torch.utils.flop_counter's formulas. Memory-bound ops (pointwise, reductions,
copies) are charged for the bytes they read and write, converted to flops at FLOPS_PER_BYTE — the ratio of compute
to memory bandwidth of a typical accelerator-less training box, so that a 1 MiB pointwise op costs about as much as a
10 MFLOP matmul. Views and getitems cost nothing: they only re-label memory.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

import torch.fx as fx
from torch.utils.flop_counter import flop_registry

from . import _torch
from .capture import BACKWARD_FORMULA, Graph, Role, returns_alias, sym_hint, tensor_bytes

FLOPS_PER_BYTE = 10


def _meta(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def node_cost(node: fx.Node, is_view: bool) -> int:
    """Cost in flops of running `node` once (0 for placeholders, views and getitems)."""
    if node.op != "call_function" or is_view or not isinstance(node.target, _torch.OpOverload):
        return 0
    if returns_alias(node.target):  # split, unbind: their outputs are views
        return 0
    args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), _meta)
    out = node.meta.get("val")
    formula = flop_registry.get(node.target.overloadpacket)
    if formula is not None:
        try:
            return int(sym_hint(formula(*args, out_val=out, **kwargs)))
        except Exception:  # a formula that cannot read symbolic or unusual args: fall back to bytes moved
            pass
    leaves: list[object] = []
    fx.node.map_aggregate((args, kwargs, out), leaves.append)  # fx's containers: tuples, lists, dicts, slices
    return sum(map(tensor_bytes, leaves)) * FLOPS_PER_BYTE


def costs(joint: fx.GraphModule, graph: Graph) -> Mapping[str, int]:
    """Recompute cost of every forward value, keyed by node name (0 for other nodes: only forward values are ever
    recomputed). A forward value aot_autograd traced in the backward pass (a gradient formula's sin(x)) costs
    nothing to leave to backward: backward computes it either way."""
    table = {}
    for node in joint.graph.nodes:
        value = graph[node.name]
        formula = BACKWARD_FORMULA in value.tags
        table[node.name] = node_cost(node, value.is_view) if value.role is Role.FORWARD and not formula else 0
    return types.MappingProxyType(table)
