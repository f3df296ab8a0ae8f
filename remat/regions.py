"""Checkpoint regions the model marked itself → constraints for the planner.

A region checkpointed with remat's eager APIs (or torch.utils.checkpoint) inside torch.compile reaches the joint
graph as nodes carrying `node.meta["recompute"]` (a torch CheckpointPolicy) and `node.meta["ac_graph_id"]`. The
user asked for the eager behaviour, so without a memory budget remat plans it: values inside a region are
recomputed, outputs of selective save ops are saved, and a region's outputs read outside it are saved (as the eager
region's caller holds them; recomputing them would re-run the whole region early). With a memory budget the budget
decides and the regions are ignored (the Plan's notes say so).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping

import torch.fx as fx

from . import _torch
from .capture import BACKWARD_FORMULA, Graph, Role

_SAVE_POLICIES = ("MUST_SAVE", "PREFER_SAVE")


@dataclasses.dataclass(frozen=True)
class Regions:
    must_save: Mapping[str, str]  # name → reason
    must_recompute: Mapping[str, str]  # name → reason
    count: int  # regions marked in the graph


def _marks(joint: fx.GraphModule) -> dict[str, tuple[int, str]]:
    """Marked node name → (region number in order of first appearance, policy name)."""
    numbers: dict[object, int] = {}
    marks = {}
    for node in joint.graph.nodes:
        mark = _torch.checkpoint_mark(node)
        if mark is None:
            continue
        policy, region = mark
        number = numbers.setdefault(region, len(numbers))
        marks[node.name] = (number, getattr(policy, "name", str(policy)))
    return marks


def region_count(joint: fx.GraphModule) -> int:
    return len({number for number, _ in _marks(joint).values()})


def checkpoint_regions(joint: fx.GraphModule, graph: Graph) -> Regions:
    """must-save / must-recompute maps for the forward values inside marked regions. Pure."""
    marks = _marks(joint)
    must_save: dict[str, str] = {}
    must_recompute: dict[str, str] = {}
    for value in graph.values:
        if value.role is not Role.FORWARD or value.name not in marks:
            continue
        number, policy = marks[value.name]
        # A gradient formula traced in the backward reads the value there, however the capture classes it.
        outside = [
            u
            for u in value.users
            if graph[u].role in (Role.FORWARD, Role.OUTPUT)
            and BACKWARD_FORMULA not in graph[u].tags
            and marks.get(u, (None,))[0] != number
        ]
        if not outside:
            if policy in _SAVE_POLICIES:
                must_save[value.name] = f"checkpoint region {number}: save ({value.op} is a save op)"
            else:
                must_recompute[value.name] = f"checkpoint region {number}: recompute"
            continue
        reader = marks.get(outside[0])
        where = f"region {reader[0]}" if reader else "outside the region"
        owner = graph[value.storage]
        if owner.role is Role.FORWARD and owner.is_tensor:
            must_save[owner.name] = f"checkpoint region {number}: output, read {where}"
    for name in must_save:
        must_recompute.pop(name, None)
    return Regions(
        types.MappingProxyType(must_save),
        types.MappingProxyType(must_recompute),
        len({number for number, _ in marks.values()}),
    )
