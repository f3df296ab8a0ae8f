"""Saved values that leave the device or move into an arena: offload, partition and contiguous, in the joint graph.

Each is the same move on the extracted modules: after the forward value `v`, insert the forward half
(`remat::offload`, `remat::shard`) and return its result in `v`'s saved slot; backward's placeholder receives it, and
the backward half (`remat::reload`; all_gather + slice + view) runs just before the first reader of `v`. Packed
values go into the arena together, in one `remat::arena_pack` as the forward's last op (so the inner compiler sees
the arena views only as outputs and never reuses their memory); backward reads them in place.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx

from .. import _torch
from ..capture import Role
from ..plan.problem import Problem, Resolved
from ..runtime import identity
from .marks import MARK


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What the inserted ops need to know at run time."""

    group: Any = None  # process group of partition; None: no partition
    check_every_call: bool = False  # compare partitioned values across ranks on every call, not only the first
    contiguous_key: int = -1  # arena key of this graph; -1: contiguous off
    profile_id: int = -1
    sync: bool = False

    @property
    def group_name(self) -> str:
        """The group's name, by which functional collectives address it; "" without partition."""
        return self.group.group_name if self.group is not None else ""

    @property
    def plain(self) -> bool:
        """No runtime op is needed: nothing partitioned, packed or profiled."""
        return not self.group_name and self.contiguous_key < 0 and self.profile_id < 0


def move_saved(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, problem: Problem,
               resolved: Resolved, runtime: Runtime) -> None:
    """Rewrite, in place, the freshly extracted forward and backward modules so offloaded, partitioned and
    (contiguous) packed saved values travel in their moved form. The saved slot of each keeps its position: the
    forward returns the moved form there and backward's placeholder receives it."""
    output = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    outs = list(output.args[0])
    saved = [(i, n) for i, n in enumerate(outs) if i >= num_fwd_outputs and isinstance(n, fx.Node)]
    packed = _packed(problem, resolved, runtime, [n.name for _, n in saved])
    if not (resolved.offloaded or resolved.partitioned or packed):
        return
    placeholders = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    for i, node in saved:
        name = node.name
        move = _offload if name in resolved.offloaded else _partition if name in resolved.partitioned else None
        if move is not None and name in placeholders:
            outs[i] = move(fw, bw, node, placeholders[name], problem, runtime)
    slots = [(i, node) for i, node in saved if node.name in packed and node.name in placeholders]
    if slots:
        _pack(fw, output, outs, slots, placeholders, runtime)
    output.args = (tuple(outs),) + tuple(output.args[1:])
    for gm in (fw, bw):
        gm.graph.lint()
        gm.recompile()


def _packed(problem: Problem, resolved: Resolved, runtime: Runtime, saved: list[str]) -> list[str]:
    if runtime.contiguous_key < 0:
        return []
    moved = resolved.offloaded | resolved.partitioned
    out = []
    for name in saved:
        v = problem.graph.by_name.get(name)
        if v is None:  # a generator state of a replayed op: tiny, stays where it is
            continue
        if v.role is Role.FORWARD and v.is_tensor and not v.is_view and v.nbytes > 0 and name not in moved:
            out.append(name)
    return out


def _offload(fw, bw, node, placeholder, problem, runtime):
    device = node.meta["val"].device
    host = _after(fw, node, torch.ops.remat.offload.default, (node, runtime.profile_id, runtime.sync), "offload")
    _receive(placeholder, host)
    _before_users(bw, placeholder, [(torch.ops.remat.reload.default,
                                     lambda p: (p, device, runtime.profile_id, runtime.sync))], "reload")
    return host


def _partition(fw, bw, node, placeholder, problem, runtime):
    t = problem.transfer
    val = node.meta["val"]
    check_id = identity.register(node.name, runtime.group, runtime.check_every_call)
    shard = _after(fw, node, torch.ops.remat.shard.default,
                   (node, t.rank, t.world, runtime.profile_id, runtime.sync, check_id), "shard")
    _receive(placeholder, shard)
    chain = [
        (torch.ops._c10d_functional.all_gather_into_tensor.default, lambda p: (p, t.world, runtime.group_name)),
        (torch.ops._c10d_functional.wait_tensor.default, lambda p: (p,)),
        (torch.ops.aten.slice.Tensor, lambda p: (p, 0, 0, val.numel())),
        (torch.ops.aten.view.default, lambda p: (p, list(val.shape))),
    ]
    _before_users(bw, placeholder, chain, "gather")
    return shard


def _pack(fw, output, outs, slots, placeholders, runtime) -> None:
    """One `remat::arena_pack` of every packed value, right before the forward returns them."""
    nodes = [node for _, node in slots]
    with fw.graph.inserting_before(output):
        pack = fw.graph.call_function(torch.ops.remat.arena_pack.default,
                                      (nodes, runtime.contiguous_key, runtime.profile_id, runtime.sync))
        pack.meta["val"] = _fake_run(torch.ops.remat.arena_pack.default, pack.args)
        for k, (i, node) in enumerate(slots):
            slot = fw.graph.call_function(operator.getitem, (pack, k))
            slot.name = f"{node.name}_packed"
            slot.meta["val"] = pack.meta["val"][k]
            _receive(placeholders[node.name], slot)
            outs[i] = slot


def _after(gm: fx.GraphModule, node: fx.Node, target, args: tuple, suffix: str) -> fx.Node:
    with gm.graph.inserting_after(node):
        new = gm.graph.call_function(target, args)
    new.name = f"{node.name}_{suffix}"
    new.meta["val"] = _fake_run(target, args)
    return new


def _receive(placeholder: fx.Node, moved: fx.Node) -> None:
    """Backward's placeholder now receives the moved form."""
    placeholder.meta["val"] = moved.meta["val"]
    placeholder.meta.pop("tensor_meta", None)


def _before_users(bw: fx.GraphModule, placeholder: fx.Node, chain: list, suffix: str) -> None:
    """Insert the backward half, a chain of (op, args from the previous node) pairs, right before the first reader
    of `placeholder`, and route every reader to its last node."""
    users = list(placeholder.users)
    if not users:
        return
    order = {n: i for i, n in enumerate(bw.graph.nodes)}
    first = min(users, key=order.__getitem__)
    current = placeholder
    with bw.graph.inserting_before(first):
        for step, (op, make_args) in enumerate(chain):
            node = bw.graph.call_function(op, make_args(current))
            node.name = f"{placeholder.name}_{suffix}" + (f"_{step}" if step else "")
            node.meta[MARK] = (suffix, placeholder.name)
            node.meta["val"] = _fake_run(op, node.args)
            current = node
    for user in users:
        user.replace_input_with(placeholder, current)


def _fake_run(target, args):
    vals = fx.node.map_arg(args, lambda n: n.meta["val"])
    tensor = next(v for v in _torch.tree_leaves(vals) if isinstance(v, torch.Tensor))
    mode = getattr(tensor, "fake_mode", None)
    if mode is None:
        return target(*vals)
    with mode:
        return target(*vals)


