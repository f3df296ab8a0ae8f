"""Saved values that leave the device or move into an arena: offload, shard (the partition= option) and contiguous.

Each move is the same on the extracted modules, as its entry in runtime/table.py declares it: after the forward
value `v`, insert the move's forward op (`remat::offload`, `remat::shard`) and return its result in `v`'s saved slot;
backward's placeholder receives it, and the move's backward chain (`remat::reload`; all_gather + slice + view) runs
just before the first reader of `v`. A packed value (contiguous=True) is stored in the step's arena
(`remat::arena_store`) and backward reads the arena's copy. In the forward, a value a library call computes is
stored right after it and every later reader reads the copy, so the value's own allocation is freed at once; under
inductor, a value a loop computes is read by the forward's readers themselves, which inductor then fuses with that
loop, and stored after the last of them (Problem.reads_unpacked). The forward returns the arena's copy (a graph
output, whose memory a compiler never reuses) in the saved slot and, where the value is also a forward output, the
value itself there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from .. import _torch
from ..plan.problem import Problem, Resolved
from ..plan.transfer import packed as packed_values
from ..runtime.table import ARENA_STORE, Move, Site, target
from .marks import MARK


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What the inserted ops need to know at run time."""

    group: Any = None  # process group values are sharded over (the partition= option); None: none
    check_every_call: bool = False  # compare sharded values across ranks on every call, not only the first
    contiguous_key: int = -1  # arena key of this graph; -1: contiguous off
    profile_id: int = -1
    sync: bool = False

    @property
    def group_name(self) -> str:
        """The group's name, by which functional collectives address it; "" without sharding."""
        return self.group.group_name if self.group is not None else ""

    @property
    def plain(self) -> bool:
        """No runtime op is needed: nothing sharded, packed or profiled."""
        return not self.group_name and self.contiguous_key < 0 and self.profile_id < 0


def move_saved(
    fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, problem: Problem, resolved: Resolved, runtime: Runtime
) -> None:
    """Rewrite, in place, the freshly extracted forward and backward modules so offloaded, sharded and
    (contiguous) packed saved values travel in their moved form. The saved slot of each keeps its position: the
    forward returns the moved form there and backward's placeholder receives it."""
    output = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    outs = list(output.args[0])
    saved = [(i, n) for i, n in enumerate(outs) if i >= num_fwd_outputs and isinstance(n, fx.Node)]
    packed = _packed(problem, resolved, runtime, [n.name for _, n in saved])
    moves = resolved.moves
    if not (moves or packed):
        return
    placeholders = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    for i, node in saved:
        move = moves.get(node.name)
        if move is not None and node.name in placeholders:
            outs[i] = _move(fw, bw, node, placeholders[node.name], move, _site(node, problem, runtime))
    stored: dict[str, fx.Node] = {}
    position = {n: p for p, n in enumerate(fw.graph.nodes)}
    for i, node in saved:
        if node.name in packed and node.name in placeholders:
            if node.name not in stored:
                unpacked = node.name in problem.reads_unpacked
                stored[node.name] = _store(
                    fw, node, output, len(packed), placeholders[node.name], runtime, position, unpacked
                )
            outs[i] = stored[node.name]
    output.args = (tuple(outs),) + tuple(output.args[1:])
    for gm in (fw, bw):
        gm.graph.lint()
        gm.recompile()


def _packed(problem: Problem, resolved: Resolved, runtime: Runtime, saved: list[str]) -> list[str]:
    """The saved values stored in the arena, each once (the rule is plan/transfer.py's, which the simulation
    follows)."""
    if runtime.contiguous_key < 0:
        return []
    return packed_values(problem.graph, dict.fromkeys(saved), resolved.moves)


def _site(node: fx.Node, problem: Problem, runtime: Runtime) -> Site:
    t = problem.transfer
    return Site(
        node.name,
        node.meta["val"],
        runtime.profile_id,
        runtime.sync,
        t.rank,
        t.world,
        runtime.group,
        runtime.group_name,
        runtime.check_every_call,
    )


def _move(
    fw: fx.GraphModule, bw: fx.GraphModule, node: fx.Node, placeholder: fx.Node, move: Move, site: Site
) -> fx.Node:
    """`move`'s forward op right after `node`, its backward chain right before the first reader of `placeholder`;
    the forward op's result, which the forward returns in `node`'s saved slot."""
    op, make_args = move.forward
    kept = _after(fw, node, target(op), make_args(node, site), op.name)
    _receive(placeholder, kept)
    _before_users(bw, placeholder, move, site)
    return kept


def _store(
    fw: fx.GraphModule,
    node: fx.Node,
    output: fx.Node,
    num_slots: int,
    placeholder: fx.Node,
    runtime,
    position: dict[fx.Node, int],
    unpacked: bool,
) -> fx.Node:
    """`remat::arena_store` of `node`, for the saved slot. Where the forward's readers read `node` itself
    (Problem.reads_unpacked: inductor then fuses them with the loop computing it), right after the last of them
    (`position`: each node's place in the forward before the stores; were the store first, inductor could compute a
    pointwise `node` twice: once for the store, once for a library call reading it); else right after `node`, and
    every forward reader but the output reads the stored copy."""
    args = (node, runtime.contiguous_key, num_slots, runtime.profile_id, runtime.sync)
    if unpacked:
        readers = (user for user in node.users if user in position and user.op != "output")
        kept = _after(fw, max(readers, key=position.__getitem__, default=node), ARENA_STORE.overload, args, "packed")
    else:
        kept = _after(fw, node, ARENA_STORE.overload, args, "packed")
        node.replace_all_uses_with(kept, delete_user_cb=lambda user: user is not kept and user is not output)
    _receive(placeholder, kept)
    return kept


def _after(gm: fx.GraphModule, node: fx.Node, op, args: tuple, suffix: str) -> fx.Node:
    """`op(*args)` right after `node`, named after its first argument."""
    with gm.graph.inserting_after(node):
        new = gm.graph.call_function(op, args)
    new.name = f"{args[0].name}_{suffix}"
    new.meta["val"] = _fake_run(op, args)
    return new


def _receive(placeholder: fx.Node, moved: fx.Node) -> None:
    """Backward's placeholder now receives the moved form."""
    placeholder.meta["val"] = moved.meta["val"]
    placeholder.meta.pop("tensor_meta", None)


def _before_users(bw: fx.GraphModule, placeholder: fx.Node, move: Move, site: Site) -> None:
    """Insert `move`'s backward chain right before the first reader of `placeholder`, and route every reader to its
    last node. Each node is marked with the move's profile key (marks.py)."""
    users = list(placeholder.users)
    if not users:
        return
    order = {n: i for i, n in enumerate(bw.graph.nodes)}
    first = min(users, key=order.__getitem__)
    current = placeholder
    with bw.graph.inserting_before(first):
        for step, (op, make_args) in enumerate(move.backward):
            node = bw.graph.call_function(target(op), make_args(current, site))
            node.name = f"{placeholder.name}_{move.profile}" + (f"_{step}" if step else "")
            node.meta[MARK] = (move.profile, placeholder.name)
            node.meta["val"] = _fake_run(node.target, node.args)
            current = node
    for user in users:
        user.replace_input_with(placeholder, current)


def _fake_run(op, args):
    vals = fx.node.map_arg(args, lambda n: n.meta["val"])
    tensor = next(v for v in _torch.tree_leaves(vals) if isinstance(v, torch.Tensor))
    mode = getattr(tensor, "fake_mode", None)
    if mode is None:
        return op(*vals)
    with mode:
        return op(*vals)
