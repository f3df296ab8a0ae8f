"""RNG-safe replay: a random op recomputed in backward draws exactly the numbers the forward drew.

In the joint graph each replayed random op `r = op(*args)` becomes `state, r = run_and_save_rng_state(op, *args)`
(the forward records the generator state before drawing, a few bytes), and backward's copy becomes
`run_with_rng_state(state, op, *args)`, which draws from that state and leaves the generator as it found it. The
recomputed values between the op and backward are duplicated so the forward keeps its own and backward reads the
replayed ones; `state` joins the saved values. The generator therefore advances once per step, as uncompiled.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import _torch
from ..annotate import rng_state_bytes
from ..capture import Role
from ..plan.problem import Problem, Resolved
from .marks import MARK


def replay_random_ops(joint: fx.GraphModule, problem: Problem, resolved: Resolved) -> tuple[fx.GraphModule, list[str]]:
    """A copy of the joint graph with every replayed random op rewritten; returns it and the names of the state
    nodes to save."""
    replayed = sorted(
        (n for n in resolved.recomputed if n in problem.constraints.replay), key=lambda n: problem.graph[n].index
    )
    if not replayed:
        return joint, []
    gm = fx.GraphModule(joint, _copy_graph(joint.graph))
    gm.meta.update(joint.meta)
    nodes = {n.name: n for n in gm.graph.nodes}
    run_and_save, run_with = _torch.rng_replay_ops()
    calls: dict[fx.Node, tuple] = {}  # forward copy of a replayed op → (state, op, args, kwargs)
    for name in replayed:
        r = nodes[name]
        op, args, kwargs = r.target, r.args, dict(r.kwargs)
        with gm.graph.inserting_before(r):
            pair = gm.graph.call_function(run_and_save, (op, *args), kwargs)
            state = gm.graph.call_function(operator.getitem, (pair, 0))
            out = gm.graph.call_function(operator.getitem, (pair, 1))
        state.name = f"{name}_rng_state"
        state.meta["val"] = _state_val(r.meta["val"])
        out.meta.update(r.meta)
        pair.meta["val"] = (state.meta["val"], r.meta["val"])
        r.replace_all_uses_with(out)
        gm.graph.erase_node(r)
        out.name = name  # the planner's name stays on the forward copy
        calls[out] = (state, op, args, kwargs)
    _backward_copies(gm, calls, run_with, problem.graph, resolved.recomputed)
    gm.graph.lint()
    gm.recompile()
    return gm, [calls[out][0].name for out in calls]


def _backward_copies(gm: fx.GraphModule, calls, run_with, graph, recomputed) -> None:
    """Backward gets its own copy of every recomputed value downstream of a replayed op, the op itself re-run from
    its saved state; backward nodes read the copies, forward nodes keep the originals."""
    downstream: set[fx.Node] = set()
    stack = list(calls)
    while stack:
        node = stack.pop()
        if node not in downstream:
            downstream.add(node)
            stack.extend(u for u in node.users if u.name in recomputed)
    copies: dict[fx.Node, fx.Node] = {}
    for node in [n for n in gm.graph.nodes if n in downstream]:
        with gm.graph.inserting_after(node):
            if node in calls:
                state, op, args, kwargs = calls[node]
                args = fx.node.map_arg(args, lambda a: copies.get(a, a))
                copy = gm.graph.call_function(run_with, (state, op, *args), kwargs)
                copy.meta.update(node.meta)
            else:
                copy = gm.graph.node_copy(node, lambda a: copies.get(a, a))
        copy.name = f"{node.name}_replay"
        copy.meta[MARK] = ("replay", node.name)
        copies[node] = copy
    for original, copy in copies.items():
        for user in list(original.users):
            if _is_backward(user, graph):
                user.replace_input_with(original, copy)


def _is_backward(node: fx.Node, graph) -> bool:
    value = graph.by_name.get(node.name)
    return value is not None and value.role is Role.BACKWARD


def _state_val(val):
    first = val[0] if isinstance(val, (tuple, list)) else val
    mode = getattr(first, "fake_mode", None)
    device = first.device.type
    numel = rng_state_bytes(device)
    if mode is None:
        return torch.empty(numel, dtype=torch.uint8)
    with mode:
        return torch.empty(numel, dtype=torch.uint8)


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    output = new.graph_copy(graph, {})
    new.output(output)
    return new
