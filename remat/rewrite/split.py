"""(joint graph, plan) → forward module + backward module.

The forward module returns the user outputs plus the saved values; everything backward needs and does not get saved
is copied into the backward module and recomputed there. The backward module is then reordered to the schedule the
simulator assumed: each recomputed chain just before its first backward use, so it is freed after its last.
"""

from __future__ import annotations

from typing import Sequence

import torch.fx as fx

from .. import _torch
from ..capture import COLLECTIVE_NAMESPACES, Role
from ..plan.problem import Problem, Resolved
from ..plan.schedule import backward_order, forward_order
from .marks import MARK, recomputed
from .profile import mark_recomputation, mark_step
from .rng import replay_random_ops
from .transfer import Runtime, move_saved


def split(
    joint: fx.GraphModule,
    problem: Problem,
    resolved: Resolved,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    runtime: Runtime = Runtime(),
) -> tuple[fx.GraphModule, fx.GraphModule]:
    joint, states = replay_random_ops(joint, problem, resolved)
    nodes = {n.name: n for n in joint.graph.nodes}
    is_sym = _torch.is_sym_node()
    graph = problem.graph
    saved = sorted(resolved.saved | resolved.inputs, key=lambda n: graph[n].index)
    saved_values = [nodes[n] for n in saved if not is_sym(nodes[n]) and not graph[n].is_opaque]
    saved_values += [nodes[n] for n in states]
    saved_syms = [nodes[n] for n in saved if is_sym(nodes[n])]
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    static = [placeholders[i] for i in static_lifetime_input_indices or ()]
    fw, bw = _torch.split_joint(
        joint,
        saved_values,
        saved_syms,
        _opaque(problem, nodes),
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_inputs=static,
    )
    _dead_code(fw)
    _dead_code(bw)
    if problem.fuses:
        run_early(fw, forward_order(problem, resolved))
    move_saved(fw, bw, num_fwd_outputs, problem, resolved, runtime)
    bw = reorder(bw, backward_order(problem, resolved))
    if problem.fuses and not problem.hoists:
        mark_blocks(bw, resolved)
    if runtime.profile_id >= 0:
        mark_step(fw, runtime.profile_id)
        mark_recomputation(bw, problem, resolved, runtime.profile_id)
    return fw, bw


def mark_blocks(bw: fx.GraphModule, resolved: Resolved) -> None:
    """Cut the backward module into numbered segments (node.meta[BLOCK]): each run of recomputed nodes starts one,
    which holds the run and the backward work after it up to the next run (segment 0: the work before the first).
    inductor's fusion then keeps each segment's loops where the schedule puts them (_torch.fusion_barrier)."""
    segment, previous = 0, False
    for node in bw.graph.nodes:
        if node.op != "call_function":
            continue
        here = recomputed(node, resolved.recomputed)
        segment += here and not previous
        node.meta[_torch.BLOCK] = segment
        previous = here


def _opaque(problem: Problem, nodes: dict[str, fx.Node]) -> list[fx.Node]:
    """The opaque objects forward hands to backward (a DTensor's device mesh, a process group): those a backward
    node reads or backward returns (a DTensor gradient's mesh)."""
    graph = problem.graph
    returned = set(graph.bw_outputs)
    return [
        nodes[v.name]
        for v in graph.values
        if v.is_opaque
        and v.role in (Role.PRIMAL, Role.FORWARD)
        and v.name in nodes
        and (v.name in returned or any(graph[u].role is Role.BACKWARD for u in v.users))
    ]


def _dead_code(gm: fx.GraphModule) -> None:
    # Collectives are impure to fx's DCE, but one whose result is unused must go too (as torch's partitioners do).
    try:
        gm.graph.eliminate_dead_code(is_impure_node=_is_impure)
    except TypeError:
        gm.graph.eliminate_dead_code()
    gm.recompile()


def _is_impure(node: fx.Node) -> bool:
    namespace = getattr(node.target, "namespace", "")
    if namespace in COLLECTIVE_NAMESPACES:
        return False
    return node.is_impure()


def run_early(gm: fx.GraphModule, order: Sequence[str]) -> None:
    """Move the forward module's nodes that `order` (schedule.forward_ids) places earlier than the joint graph did
    to their place in `order`: each right after the node before it there."""
    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    by_name = {n.name: n for n in nodes}
    present = [by_name[name] for name in order if name in by_name]
    moved = False
    for previous, node in zip(present, present[1:]):
        if position[node] < position[previous] or node.prev is previous:
            continue
        if any(position[i] > position[previous] for i in node.all_input_nodes):
            continue  # reads a node the order does not place (kept where it is, and so is this one)
        previous.append(node)
        moved = True
        position = {n: i for i, n in enumerate(gm.graph.nodes)}
    if moved:
        gm.graph.lint()
        gm.recompile()


def reorder(gm: fx.GraphModule, order: Sequence[str]) -> fx.GraphModule:
    """A copy of `gm` whose nodes run in `order` (names absent from `gm` are skipped; nodes of `gm` missing from
    `order` run just before their first user). Inputs always precede their users."""
    old = list(gm.graph.nodes)
    by_name = {n.name: n for n in old}
    # A random op's backward copy (and the values computed from it) take the schedule slot of the node it replays.
    rank = {name: i for i, name in enumerate(order)}
    replays = {n.name: n.meta[MARK][1] for n in old if n.meta.get(MARK, ("",))[0] == "replay"}
    rank.update({name: rank[of] for name, of in replays.items() if of in rank})
    body = [n for n in old if n.op not in ("placeholder", "output")]
    wanted = sorted((n for n in body if n.name in rank), key=lambda n: rank[n.name])
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in old:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)

    def emit(root: fx.Node) -> None:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in env:
                continue
            if expanded:
                env[node] = graph.node_copy(node, env.__getitem__)
                continue
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.all_input_nodes) if i not in env)

    for node in wanted:
        emit(node)
    output = by_name[old[-1].name]
    for node in output.all_input_nodes:
        emit(node)
    graph.node_copy(output, env.__getitem__)
    new = fx.GraphModule(gm, graph)
    new.meta.update(gm.meta)
    return new
