"""The kernels of the remat:: ops the rewritten graphs call; table.py declares each op (its fake implementation,
profile key, and how the rewrite and the planner use it) and registers the kernels here with torch.library, so every
inner compiler takes them.

- ``remat::offload(x)`` → a host copy of `x` (pinned, on a side stream, on CUDA; a plain copy on CPU);
  ``remat::reload(host, device)`` → the device copy back. Strides are kept for dense tensors; other views (expanded,
  overlapping) come back contiguous with the same values.
- ``remat::shard(x, rank, world, ..., check_id)`` → this rank's 1/world of `x` flattened (zero-padded to a multiple
  of world; profiled as "shard", this rank's bytes), after checking that `x` is the same on every rank when the
  check `check_id` is due (identity.py); backward gathers the shards with torch's functional all_gather and views
  the result back.
- ``remat::arena_store(x, key, num_slots)`` → `x` copied into the next slot of graph `key`'s arena for this step
  (`num_slots` values per step), or into an allocation of its own while the pool does not know the arena's size.
- ``remat::mark(anchor, profile_id, label, kind, nbytes, begin)`` → profile timestamps around a run of
  recomputation or a gather in backward (`anchor` names the device). Exact where the backward runs node by node
  (aot_eager, eager); inductor fuses recomputation into its consumers and drops the marks, so there the profile
  has recompute flops but no recompute time.

Every op takes `profile_id` (-1: none) and `sync` (DeepSpeed's `synchronize`: wait for the device around the op).
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from . import buffers, identity, profile, streams
from .collective import all_gather
from .table import ARENA_STORE, MARK, OFFLOAD, RELOAD, SHARD, SHARDING, shard_numel

__all__ = ["arena_store", "gather_shards", "mark", "offload", "reload", "shard", "shard_numel"]


def _timed(profile_id: int, kind: str | None, nbytes: int, sync: bool, device: torch.device, work):
    if sync:
        profile.synchronize(device)
    record = profile.lookup(profile_id) if kind else None
    start = time.perf_counter() if record else 0.0
    out = work()
    if sync:
        profile.synchronize(device)
    if record and kind:
        record.add(kind, time.perf_counter() - start, nbytes)
    return out


@OFFLOAD.register
def offload(x: Tensor, profile_id: int = -1, sync: bool = False) -> Tensor:
    nbytes = x.numel() * x.element_size()

    def work() -> Tensor:
        if x.device.type == "cuda":
            return streams.to_host(x)
        host = torch.empty_like(x, device="cpu")
        return host.copy_(x)

    return _timed(profile_id, OFFLOAD.profile, nbytes, sync, x.device, work)


@RELOAD.register
def reload(host: Tensor, device: torch.device, profile_id: int = -1, sync: bool = False) -> Tensor:
    nbytes = host.numel() * host.element_size()

    def work() -> Tensor:
        if device.type == "cuda":
            return streams.to_device(host, device)
        return torch.empty_like(host, device=device).copy_(host)

    return _timed(profile_id, RELOAD.profile, nbytes, sync, device, work)


@SHARD.register
def shard(x: Tensor, rank: int, world: int, profile_id: int = -1, sync: bool = False, check_id: int = -1) -> Tensor:
    identity.verify(check_id, x)  # the ranks agree that x is one value before each keeps only its part
    chunk = shard_numel(x.numel(), world)

    def work() -> Tensor:
        flat = x.reshape(-1)
        out = torch.zeros(chunk, dtype=x.dtype, device=x.device)
        start = min(rank * chunk, flat.numel())
        stop = min(start + chunk, flat.numel())
        out[: stop - start].copy_(flat[start:stop])
        return out

    return _timed(profile_id, SHARD.profile, chunk * x.element_size(), sync, x.device, work)


def gather_shards(
    chunk: Tensor, shape: torch.Size, world: int, group=None, profile_id: int = -1, sync: bool = False
) -> Tensor:
    """The value `remat::shard` split: every rank's chunk gathered over `group` (all ranks take part), unpadded and
    viewed back to `shape`. The eager counterpart of the sharded value's backward."""
    numel = math.prod(shape)

    def work() -> Tensor:
        if world == 1:
            return chunk[:numel].view(shape)
        # A private copy: the gather keeps its input until the next one (collective.all_gather), which would keep a
        # contiguous arena slot in use into the next step.
        return all_gather(chunk.clone(), world, group).view(-1)[:numel].view(shape)

    return _timed(profile_id, SHARDING.profile, chunk.numel() * chunk.element_size() * world, sync, chunk.device, work)


@ARENA_STORE.register
def arena_store(x: Tensor, key: int, num_slots: int, profile_id: int = -1, sync: bool = False) -> Tensor:
    nbytes = x.numel() * x.element_size()

    def work() -> Tensor:
        placed = buffers.POOL.place(key, x.device, nbytes, num_slots)
        if placed is None or x.numel() == 0:
            return torch.empty_like(x).copy_(x)
        arena, offset = placed
        slot = arena[offset : offset + nbytes].view(x.dtype).view(x.shape) if x.is_contiguous() else None
        if slot is None:  # keep a dense non-contiguous layout: place the storage, view it with x's strides
            dense = torch.empty_like(x)
            slot = arena[offset : offset + nbytes].view(x.dtype).as_strided(x.shape, dense.stride())
        return slot.copy_(x)

    return _timed(profile_id, ARENA_STORE.profile, nbytes, sync, x.device, work)


@MARK.register
def mark(anchor: Tensor, profile_id: int, label: str, kind: str, nbytes: int, begin: bool) -> None:
    record = profile.lookup(profile_id)
    if record is None:
        return
    profile.synchronize(anchor.device)
    if kind == "step":
        record.new_step()
    elif begin:
        record.begin(label)
    else:
        record.end(label, kind, nbytes)
