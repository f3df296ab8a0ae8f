"""What a checkpointed region keeps of its inputs between forward and backward, and how it gets them back.

By default the inputs themselves (references, no copy). Options move the floating-point activations among them
through remat's runtime ops: `shard` keeps this rank's shard (``remat::shard``) and gathers the shards in
backward, `offload` keeps a host copy (``remat::offload`` / ``remat::reload``), `contiguous` places what is kept in
an arena of the pool (``remat::arena_store``), so steps after the first allocate nothing for it. Parameters and
non-tensor arguments are always kept as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .._torch import tensor_version, tree_flatten, tree_unflatten
from ..runtime import buffers
from ..runtime import identity
from ..runtime.ops import gather_shards
from ..runtime.table import arena_slot_bytes

# Pool keys of eager regions: one per arena size (the pool learns a key's size), far from compiled graphs' keys.
# A region fills all its slots in one go, so its step never stays open.
_ARENA_KEYS = -(1 << 48)


@dataclasses.dataclass(frozen=True)
class ShardGroup:
    """The model-parallel group activations are sharded over (DeepSpeed's partition_activations)."""

    rank: int
    world: int
    group: Any = None  # a torch.distributed ProcessGroup; None = the default group


@dataclasses.dataclass(frozen=True)
class StashOptions:
    offload: bool = False
    shard: ShardGroup | None = None
    contiguous: bool = False
    profile_id: int = -1
    sync: bool = False
    call_site: Any = None  # what identifies the checkpointed function: sharded inputs are checked on its first call


@dataclasses.dataclass
class _Moved:
    """One input kept in another form: `kept` is what the region holds; the rest rebuilds the input."""

    kept: torch.Tensor
    shape: torch.Size
    device: torch.device
    requires_grad: bool
    sharded: bool


class Stash:
    """A region's inputs as kept between forward and backward."""

    def __init__(self, args: tuple, kwargs: dict, options: StashOptions, reserve: int | None = None):
        leaves, self.spec = tree_flatten((args, kwargs))
        self.options = options
        moving = [i for i, leaf in enumerate(leaves) if _moves(leaf, options)]
        kept = [self._kept_form(leaves[i], i) for i in moving]
        if options.contiguous and kept:
            kept = _to_arena(kept, options, reserve)
        for i, tensor in zip(moving, kept):
            leaf = leaves[i]
            leaves[i] = _Moved(tensor, leaf.shape, leaf.device, leaf.requires_grad, options.shard is not None)
        self.leaves = leaves
        # An input modified in place after forward would make the recomputation differ silently.
        self.versions = {i: tensor_version(leaf) for i, leaf in enumerate(leaves) if _plain_tensor(leaf)}

    def _kept_form(self, x: torch.Tensor, position: int) -> torch.Tensor:
        o = self.options
        with torch.no_grad():
            x = x.detach()
            if o.shard is not None:
                check = -1  # one shard (world 1) holds the whole value: nothing to compare
                if o.shard.world > 1:
                    label = f"input {position} of {getattr(o.call_site, 'co_qualname', o.call_site)}"
                    check = identity.check_for((o.call_site, position), label, o.shard.group)
                x = torch.ops.remat.shard(x, o.shard.rank, o.shard.world, o.profile_id, o.sync, check)
            if o.offload:
                x = torch.ops.remat.offload(x, o.profile_id, o.sync)
        return x

    def kept_tensors(self) -> list[torch.Tensor]:
        """The tensors the region holds for its recomputation (inputs, or their shards / host copies)."""
        return [
            leaf.kept if isinstance(leaf, _Moved) else leaf
            for leaf in self.leaves
            if isinstance(leaf, (_Moved, torch.Tensor))
        ]

    def load(self, where: str) -> tuple[tuple, dict]:
        """The inputs again, on their devices, for the recomputation."""
        o = self.options
        leaves = list(self.leaves)
        for i, leaf in enumerate(leaves):
            if i in self.versions and tensor_version(leaf) != self.versions[i]:
                raise RuntimeError(
                    f"{where}: input {i} of the checkpointed region was modified in place after its forward, so "
                    "its recomputation would differ; clone it before modifying it, or keep it out of the region"
                )
            if not isinstance(leaf, _Moved):
                continue
            with torch.no_grad():
                x = leaf.kept
                if o.offload:
                    x = torch.ops.remat.reload(x, leaf.device, o.profile_id, o.sync)
                if leaf.sharded:
                    p = o.shard
                    assert p is not None  # values are sharded only with a shard group
                    x = gather_shards(x, leaf.shape, p.world, p.group, o.profile_id, o.sync)
                else:  # a fresh view: the kept tensor itself is never handed out
                    x = x.view(leaf.shape)
            leaves[i] = x.requires_grad_(leaf.requires_grad)
        return tree_unflatten(leaves, self.spec)


def _plain_tensor(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and not isinstance(leaf, torch.nn.Parameter)


def _moves(leaf: Any, options: StashOptions) -> bool:
    if not _plain_tensor(leaf) or not (options.offload or options.shard or options.contiguous):
        return False
    if options.shard is not None or options.contiguous:
        # Sharding and packing are for activations: floating point, at least one element per rank.
        world = options.shard.world if options.shard else 1
        return leaf.is_floating_point() and leaf.numel() >= world
    return True


def _to_arena(kept: list[torch.Tensor], options: StashOptions, reserve: int | None) -> list[torch.Tensor]:
    """Copy the kept tensors into one arena per device (views of the arena come back). A region knows its size
    before it stores, so the pool hands its first region an arena already."""
    out = list(kept)
    for device in sorted({t.device for t in kept}, key=str):
        index = [i for i, t in enumerate(kept) if t.device == device]
        nbytes = sum(arena_slot_bytes(kept[i].numel() * kept[i].element_size()) for i in index)
        key = _ARENA_KEYS - nbytes
        buffers.POOL.reserve(key, device, nbytes, reserve or 0)
        with torch.no_grad():
            for i in index:
                out[i] = torch.ops.remat.arena_store(
                    kept[i].contiguous(), key, len(index), options.profile_id, options.sync
                )
    return out
