"""remat's checkpoint ops, each declared once; the runtime, the rewrite, the planner and the profile read them here.

An `Op` is a custom op registered as ``remat::<name>``: its fake implementation (the result's shape, dtype and
device: all a compiler traces) and the profile key its kernel records time and bytes under. Its kernel is in ops.py,
registered with `Op.register`.

A `Move` is a way a saved value travels from forward to backward in another form than itself on the device; its
decision rows carry the `remat.Action` named by `action`. It declares
- how the rewrite inserts it (rewrite/transfer.py): `forward` right after the value, whose result the forward saves,
  and `backward`, the chain that rebuilds the value right before backward's first reader of it;
- its effect in the simulation (plan/simulate.py, plan/decisions.py): the value is on the device until its last
  forward read and again from its first backward read; in between its kept form holds `kept(...)` device bytes, and
  `host_copies` copies of the value cross the host link, timed at `host_bandwidth`;
- its profile keys: the forward op's own, and `profile` for the backward chain (bracketed by ``remat::mark`` when the
  chain is not one timed remat op).

A new checkpoint op is an entry here plus its kernel in ops.py; a new way to keep saved values is a Move (with its
Action member) and the planner's rule for which values take it (plan/problem.py). `PROFILE_KEYS` is every key
runtime/profile.py records, recomputation first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import Tensor

from . import identity

NAMESPACE = "remat"


@dataclasses.dataclass(frozen=True)
class Op:
    """One ``remat::<name>`` op."""

    name: str
    fake: Callable[..., Any]  # the result's metadata from the arguments' (under FakeTensorMode); same signature
    profile: str | None = None  # key the kernel records its time and bytes under; None: it records none itself
    tags: tuple[torch.Tag, ...] = ()  # torch.library tags (how a compiler must treat its arguments)

    @property
    def overload(self) -> Any:
        """torch.ops.remat.<name>.default, the target of the graph nodes that call it."""
        return getattr(getattr(torch.ops, NAMESPACE), self.name).default

    def register(self, kernel: Callable[..., Any]) -> Any:
        """Register `kernel` as this op (ops.py decorates each kernel with it); returns the callable op."""
        op = torch.library.custom_op(f"{NAMESPACE}::{self.name}", kernel, mutates_args=(), tags=self.tags)
        op.register_fake(self.fake)
        return op


def shard_numel(numel: int, world: int) -> int:
    """Elements each rank keeps of a value with `numel` elements: ceil(numel / world), the last shard zero-padded."""
    return -(-numel // world)


ARENA_ALIGN = 64  # bytes; every arena slot starts at a multiple of this


def arena_slot_bytes(nbytes: int) -> int:
    """Bytes a value of `nbytes` takes in a contiguous arena: rounded up to ARENA_ALIGN. The arena pool places
    values by it and the simulation sizes the arena by it."""
    return -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN


def _offload_fake(x: Tensor, profile_id: int = -1, sync: bool = False) -> Tensor:
    return torch.empty_like(x, device="cpu")


def _reload_fake(host: Tensor, device: torch.device, profile_id: int = -1, sync: bool = False) -> Tensor:
    return torch.empty_like(host, device=device)


def _shard_fake(
    x: Tensor, rank: int, world: int, profile_id: int = -1, sync: bool = False, check_id: int = -1
) -> Tensor:
    return x.new_empty(shard_numel(x.numel(), world))


def _arena_store_fake(x: Tensor, key: int, num_slots: int, profile_id: int = -1, sync: bool = False) -> Tensor:
    return torch.empty_like(x)


def _mark_fake(anchor: Tensor, profile_id: int, label: str, kind: str, nbytes: int, begin: bool) -> None:
    return None


OFFLOAD = Op("offload", _offload_fake, "offload")  # a host copy (pinned, on a side stream, on CUDA)
RELOAD = Op("reload", _reload_fake, "reload")  # the device copy of a host copy
SHARD = Op("shard", _shard_fake, "shard")  # this rank's 1/world of a value, flattened
# A value copied into the next slot of an arena: the inserted op of contiguous=True, right after each saved value.
# Its argument keeps the stride order of the graph's value, so its result has the strides the forward returns it with:
# inductor then returns the slot itself rather than a copy, and never reuses the slot's memory for buffers of its own.
ARENA_STORE = Op("arena_store", _arena_store_fake, "pack", tags=(torch.Tag.needs_fixed_stride_order,))
MARK = Op("mark", _mark_fake)  # a profile timestamp around recomputation or a backward chain without its own timing
OPS = (OFFLOAD, RELOAD, SHARD, ARENA_STORE, MARK)


@dataclasses.dataclass(frozen=True)
class Site:
    """What an inserted op's arguments are made of: the value it moves and the settings of the compiled graph."""

    value: str  # name of the saved value
    val: Any  # its tensor (a fake one while the rewrite runs)
    profile_id: int = -1
    sync: bool = False
    rank: int = 0
    world: int = 1
    group: Any = None  # the process group values are sharded over (the partition= option); None: none
    group_name: str = ""  # its name, by which functional collectives address it
    check_every_call: bool = False  # compare sharded values across ranks on every call, not only the first


# (op: an Op or another OpOverload, its arguments from the node before it in the chain and the site)
Step = tuple[Any, Callable[[Any, Site], tuple]]


def target(op: Any) -> Any:
    """The graph target of a chain step's op."""
    return op.overload if isinstance(op, Op) else op


@dataclasses.dataclass(frozen=True)
class Move:
    """A way saved values travel from forward to backward, other than whole on the device."""

    action: str  # value of the remat.Action its decision rows carry
    participle: str  # how a plan's totals count its values ("2 offloaded")
    forward: Step  # inserted right after the value; the forward saves its result
    backward: tuple[Step, ...]  # rebuilds the value from the saved form, right before backward's first reader
    profile: str  # key the backward chain's time and bytes go to
    kept: Callable[[int, int, str, int], int]  # device bytes of the kept form: (value bytes, itemsize, device, world)
    host_copies: int = 0  # copies of the value over the host link per step

    @property
    def marked(self) -> bool:
        """The backward chain is not one timed remat op: the rewrite brackets it with remat::mark for the profile,
        counting the bytes its first op returns."""
        first = self.backward[0][0]
        return not (isinstance(first, Op) and first.profile == self.profile)


def _shard_kept(nbytes: int, itemsize: int, device: str, world: int) -> int:
    return shard_numel(nbytes // itemsize, world) * itemsize


OFFLOADING = Move(
    action="offload",
    participle="offloaded",
    forward=(OFFLOAD, lambda x, s: (x, s.profile_id, s.sync)),
    backward=((RELOAD, lambda p, s: (p, s.val.device, s.profile_id, s.sync)),),
    profile="reload",
    # On CPU the host is the device: the host copy stays in the same memory.
    kept=lambda nbytes, itemsize, device, world: nbytes if device == "cpu" else 0,
    host_copies=2,
)
SHARDING = Move(
    action="partition",
    participle="partitioned",
    # The ranks agree that the value is one before each keeps only its part (identity.py).
    forward=(
        SHARD,
        lambda x, s: (
            x,
            s.rank,
            s.world,
            s.profile_id,
            s.sync,
            identity.register(s.value, s.group, s.check_every_call),
        ),
    ),
    backward=(
        (torch.ops._c10d_functional.all_gather_into_tensor.default, lambda p, s: (p, s.world, s.group_name)),
        (torch.ops._c10d_functional.wait_tensor.default, lambda p, s: (p,)),
        (torch.ops.aten.slice.Tensor, lambda p, s: (p, 0, 0, s.val.numel())),
        (torch.ops.aten.view.default, lambda p, s: (p, list(s.val.shape))),
    ),
    profile="gather",
    kept=_shard_kept,
)
MOVES = {move.action: move for move in (OFFLOADING, SHARDING)}  # by Action value

RECOMPUTE = "recompute"  # the profile key of recomputation, timed by remat::mark around each run of it


def _profile_keys() -> tuple[str, ...]:
    keys = [RECOMPUTE]
    for move in MOVES.values():
        keys += [move.forward[0].profile, move.profile]
    keys += [op.profile for op in OPS if op.profile]
    return tuple(dict.fromkeys(keys))


PROFILE_KEYS = _profile_keys()
