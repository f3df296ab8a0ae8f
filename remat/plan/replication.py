"""Which forward values differ across the ranks of the shard group (partition=), as far as the graph shows it.

`partition=` shards only values identical on every rank of the group; gathering shards of differing values would
rebuild a mix of ranks' data. Two things in a joint graph make a value rank-local:

- an input aot_autograd unwrapped from a tensor subclass: a DTensor parameter's local tensor under tensor
  parallelism is this rank's shard (the joint graph holds local tensors, not placements, so every such input counts
  as a shard), and everything computed from it, e.g. a column-parallel linear's output;
- a collective over the shard group that hands each rank its own part (reduce_scatter, all_to_all).

A collective over the shard group that gives every rank the same result (all_reduce, all_gather, broadcast:
a row-parallel linear's output) makes its value replicated again. Plain inputs are taken as replicated: whether
each rank feeds the same batch is not in the graph, so data parallelism over the shard group is caught at run
time, where the ranks compare a checksum of every sharded value on its first call (runtime/identity.py).
"""

from __future__ import annotations

import types
from typing import Mapping

from ..capture import COLLECTIVE_NAMESPACES, Graph, Role, Value

# Collectives whose result is the same on every rank of their group, and those that give each rank its own part.
_REPLICATING = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "broadcast",
)
_SCATTERING = ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single")


def _collective_kind(value: Value) -> str:
    """The functional collective's name ("all_reduce"), or "" for any other node."""
    namespace, _, rest = value.op.partition(".")
    if namespace not in COLLECTIVE_NAMESPACES:
        return ""
    return rest.split(".")[0]


def rank_local(graph: Graph, group: str) -> Mapping[str, str]:
    """Forward values (and inputs) that may differ across the ranks of process group `group` (by name), each with
    the reason. Pure."""
    local: dict[str, str] = {}
    for value in graph.values:
        if value.role is Role.PRIMAL:
            if value.subclass_attr == "_local_tensor":
                local[value.name] = "this rank's shard of a DTensor input (tensor parallelism), different on each rank"
            continue
        if value.role is not Role.FORWARD:
            continue
        kind = _collective_kind(value)
        if kind and value.group == group and kind in _REPLICATING:
            continue  # every rank of the group holds the same result
        if kind and value.group == group and kind in _SCATTERING:
            local[value.name] = f"{kind} over the partition group gives each rank its own part"
            continue
        source = next((i for i in value.inputs if i in local), None)
        if source is not None:
            # Derived values carry the reason of the input or collective they come from.
            why = local[source]
            local[value.name] = why if why.startswith("computed from") else f"computed from {source}, {why}"
    return types.MappingProxyType(local)
