"""Which saved values leave the device between forward and backward: offloaded to host or sharded over ranks; and,
with contiguous=True, which of those staying go into the step's arena.

The solvers decide what to recompute; every saved value then goes to host (offload), to 1/world per rank (shard,
the partition= option) or stays whole on the device, by the rules here. The rule is applied inside
`Problem.resolve`, so every candidate plan is simulated with its transfers and the solvers plan recomputation around
them. How each move keeps a value, and what that costs, is its entry in runtime/table.py.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import torch

from ..capture import Graph, Role, Value
from ..runtime.table import OFFLOADING, Move

# Offload and shard are worth their copy only for values at least this large.
MIN_TRANSFER_BYTES = 1024
# Flops per second the compute hiding a host copy is assumed to run at (offload="auto"); a conservative figure
# for a current datacenter GPU in fp32.
DEVICE_FLOPS_PER_S = 50e12


@dataclasses.dataclass(frozen=True)
class Transfer:
    """The transfer options of a config, as the planner reads them."""

    offload: bool | str = False  # False, True (every saved value) or "auto" (where the copy hides behind compute)
    host_bandwidth: int = 12 * 10**9  # bytes per second
    world: int = 1  # ranks saved values are sharded over (the partition= option); 1: none
    rank: int = 0
    group: str = ""  # name of the shard group, as collectives in the graph name theirs
    contiguous: bool = False  # saved values on the device are stored in one arena per step (runtime/buffers.py)

    @property
    def active(self) -> bool:
        return self.offload is not False or self.world > 1


def eligible(graph: Graph, name: str) -> bool:
    v = graph[name]
    return (
        v.is_tensor
        and not v.is_view
        and v.role is Role.FORWARD
        and v.nbytes >= MIN_TRANSFER_BYTES
        and v.device in ("cpu", "cuda")
    )


def packed(graph: Graph, saved: Iterable[str], moved: Iterable[str] = ()) -> list[str]:
    """The saved values contiguous=True stores in the arena, in the order of `saved`: the forward's own tensors
    that stay on the device (not views, whose base is stored or not on its own; not empty; not moved). Names that
    are no graph value (the generator state of a replayed op: a few bytes) stay where they are."""
    moved = set(moved)
    out = []
    for name in saved:
        v = graph.by_name.get(name)
        if v is not None and v.role is Role.FORWARD and v.is_tensor and not v.is_view and v.nbytes > 0:
            if name not in moved:
                out.append(name)
    return out


def kept_bytes(value: Value, move: Move, world: int) -> int:
    """Device bytes a saved value holds between forward and backward in the form `move` keeps it (a shard: ceil(numel
    / world) elements, the last shard zero-padded, as ``remat::shard`` allocates it). The plan's decisions and the
    simulation both size kept forms here, so a value gets one size everywhere."""
    itemsize = torch.empty((), dtype=getattr(torch, value.dtype)).element_size()
    return move.kept(value.nbytes, itemsize, value.device, world)


def transfer_seconds(value: Value, move: Move, transfer: Transfer) -> float:
    """Seconds the copies of `value` over the host link take in one step under `move`, at host_bandwidth."""
    return move.host_copies * value.nbytes / transfer.host_bandwidth


def hides_offload(graph: Graph, costs: Mapping[str, int], transfer: Transfer) -> frozenset[str]:
    """Values whose copy to host and back takes no longer than the forward compute after their last forward use
    (the copy runs on a side stream while that compute runs; the reload is mirrored in backward)."""
    if transfer.offload != "auto":
        return frozenset()
    forward = [v for v in graph.values if v.role is Role.FORWARD]
    position = {v.name: i for i, v in enumerate(forward)}
    suffix = [0] * (len(forward) + 1)
    for i in range(len(forward) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + costs.get(forward[i].name, 0)
    hidden = set()
    for v in forward:
        if v.device != "cuda" or not eligible(graph, v.name):
            continue
        last = max((position[u] for u in v.users if u in position), default=position[v.name])
        if transfer_seconds(v, OFFLOADING, transfer) <= suffix[last + 1] / DEVICE_FLOPS_PER_S:
            hidden.add(v.name)
    return frozenset(hidden)
