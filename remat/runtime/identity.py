"""The condition sharding (partition=) rests on: a value sharded over a group is identical on every rank of it.

Each rank keeps 1/world of a sharded value and backward all-gathers the shards, which rebuilds the value only if
every rank held the same value (the model-/tensor-parallel group of DeepSpeed's `partition_activations`). Under data
parallelism each rank holds its own batch, and the gather would stitch together pieces of different ranks' values:
wrong gradients, no error. So before a rank discards the other shards, the ranks compare an exact checksum of the
value; a mismatch raises `PartitionMismatch` on every rank (all compare the same gathered checksums, so none hangs).

A check is registered once per sharded value of a compiled graph (or per eager checkpointed function) and runs
on its first call, or on every call when registered with `every_call` (`debug=True`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

from .collective import all_gather


class PartitionMismatch(RuntimeError):
    """A value to be sharded differs across the ranks of the shard group (the partition= option)."""


@dataclasses.dataclass
class _Check:
    label: str
    group: Any
    every_call: bool
    done: bool = False


_CHECKS: dict[int, _Check] = {}
_ids = itertools.count()
_BY_KEY: dict[Any, int] = {}


def register(label: str, group: Any, every_call: bool = False) -> int:
    """A new check of the value `label` over `group` (a ProcessGroup; None: the default group); its id for
    `remat::shard`."""
    check_id = next(_ids)
    _CHECKS[check_id] = _Check(label, group, every_call)
    return check_id


def check_for(key: Any, label: str, group: Any) -> int:
    """The check of call site `key` (registered on first use): eager regions check the inputs of each checkpointed
    function on its first call. Every rank runs the same code, so every rank checks the same calls."""
    if key not in _BY_KEY:
        _BY_KEY[key] = register(label, group)
    return _BY_KEY[key]


def verify(check_id: int, x: torch.Tensor) -> None:
    """Run check `check_id` on `x` when it is due (-1: no check)."""
    check = _CHECKS.get(check_id)
    if check is None or (check.done and not check.every_call):
        return
    check.done = True
    compare(x, check.label, check.group)


def checksum(x: torch.Tensor) -> torch.Tensor:
    """Two int64 sums over the bytes of `x` (plain and position-weighted) and its byte count: exact, so equal values
    give equal sums on every rank whatever the reduction order, and a changed or moved byte changes them. Computed
    in chunks of 1 MiB, so the scratch stays small whatever the value's size."""
    data = x.detach().contiguous().reshape(-1).view(torch.uint8)
    total = torch.zeros(2, dtype=torch.int64, device=data.device)
    for start in range(0, data.numel(), _CHUNK):
        part = data[start : start + _CHUNK].to(torch.int64)
        weights = torch.arange(start, start + part.numel(), device=data.device, dtype=torch.int64) % 65521 + 1
        total[0] += part.sum()
        total[1] += (part * weights).sum()
    return torch.cat([total, torch.tensor([data.numel()], dtype=torch.int64, device=data.device)])


_CHUNK = 1 << 20


def compare(x: torch.Tensor, label: str, group: Any = None) -> None:
    """Raise PartitionMismatch, on every rank, when `x` is not the same on all ranks of `group`."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if world == 1:
        return
    mine = checksum(x)
    if dist.get_backend(group) == "gloo":  # gloo gathers host tensors
        mine = mine.cpu()
    sums = all_gather(mine, world, group)
    differing = [r for r in range(1, world) if not torch.equal(sums[r], sums[0])]
    if differing:
        raise PartitionMismatch(
            f"partition: the saved value {label!r} differs across the ranks of the partition group (rank "
            f"{differing[0]} holds other data than rank 0), so its shards cannot be gathered back into it. "
            "Partitioning shards only activations that are identical on every rank of the group: pass the "
            "tensor-/model-parallel group (partition=<ProcessGroup>, DeepSpeed's mpu), not the data-parallel world "
            "in which each rank has its own batch"
        )
