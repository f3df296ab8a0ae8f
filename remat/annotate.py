"""User intent and graph rules → constraints on what the planner may decide.

Marking (what the user or a rule wants) is kept apart from deciding (what the solver picks): this stage only says
which values must be saved, which must be recomputed, and which the user would rather save or recompute.
"""
from __future__ import annotations

import dataclasses
import enum
import types
from typing import Callable, Mapping

import torch
import torch.fx as fx

from .capture import Graph, Role, Value


class Action(enum.Enum):
    """What to do with an activation. Policies answer with one of these (or None for no opinion)."""

    SAVE = "save"
    RECOMPUTE = "recompute"
    PREFER_SAVE = "prefer_save"
    PREFER_RECOMPUTE = "prefer_recompute"


# A soft preference scales the value's recompute cost as the solvers see it.
PREFERENCE_SCALE = {Action.PREFER_SAVE: 100.0, Action.PREFER_RECOMPUTE: 0.01}


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """What a policy sees of one forward value."""

    name: str
    op: str  # "aten.mm.default"
    target: object  # the OpOverload (or other callable) of the node
    shape: tuple
    dtype: str
    nbytes: int
    cost: int  # recompute cost in flops
    module_path: str


Policy = Callable[[NodeInfo], "Action | None"]


@dataclasses.dataclass(frozen=True)
class Constraints:
    must_save: Mapping[str, str]  # name → reason
    must_recompute: Mapping[str, str]  # name → reason
    preference: Mapping[str, Action]  # name → PREFER_SAVE / PREFER_RECOMPUTE


def _graph_rule(value: Value, graph: Graph, must_save: dict[str, str]) -> str | None:
    """Why a forward value can never be recomputed, or None."""
    if "nondeterministic_seeded" in value.tags:
        return f"random op {value.op}: recomputing it would draw new numbers"
    if "collective" in value.tags:
        return f"collective {value.op}: re-running it would communicate again"
    if "mutable" in value.tags:
        return f"{value.op} mutates its input"
    if "nondeterministic_bitwise" in value.tags:
        return f"{value.op} is not bitwise deterministic"
    mutated = [i for i in value.inputs if i in graph.mutated_inputs]
    if mutated:
        return (f"reads input {mutated[0]}, which the step mutates in place: recomputed in backward it would read "
                "the new value")
    if value.op == "getitem" and value.inputs and value.inputs[0] in must_save:
        return f"output of {value.inputs[0]}: " + must_save[value.inputs[0]]
    return None


def _hooked_values(graph: Graph, hooked: frozenset[str]) -> dict[str, str]:
    """The forward values that tensor hooks are registered on, with the reason they are kept.

    A dynamo node may trace to several joint nodes (a LayerNorm to its output, mean and rstd); the hooked tensor is
    the one the rest of the forward reads, or that the forward returns. A hooked view is kept through its base.
    """
    if not hooked:
        return {}
    outputs = set(graph.fw_outputs)
    found: dict[str, str] = {}
    for value in graph.values:
        if value.role is not Role.FORWARD or value.origin not in hooked or not value.is_tensor:
            continue
        read_on = value.name in outputs or any(
            graph[u].role is Role.FORWARD and graph[u].origin != value.origin for u in value.users)
        owner = graph[value.storage]
        if read_on and owner.role is Role.FORWARD:
            found[owner.name] = (f"tensor hook registered on {value.origin}: a hooked value is kept as the forward "
                                 "computed it, never recomputed")
    return found


def _matches(target: object, save_targets: tuple[frozenset, frozenset]) -> bool:
    packets, overloads = save_targets
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return target in overloads or target.overloadpacket in packets


def annotate(
    joint: fx.GraphModule,
    graph: Graph,
    costs: Mapping[str, int],
    save_targets: tuple[frozenset, frozenset] = (frozenset(), frozenset()),
    policy: Policy | None = None,
    hooked: frozenset[str] = frozenset(),
) -> Constraints:
    """Constraints for every forward value of the joint graph. `hooked` names the dynamo-graph nodes that carry a
    tensor hook (capture.hooked_nodes). Pure."""
    nodes = {n.name: n for n in joint.graph.nodes}
    must_save: dict[str, str] = {}
    must_recompute: dict[str, str] = {}
    preference: dict[str, Action] = {}
    observed = _hooked_values(graph, hooked)
    for value in graph.values:
        if value.role is not Role.FORWARD:
            continue
        rule = _graph_rule(value, graph, must_save) or observed.get(value.name)
        if value.is_multi:
            # A tuple has no memory of its own; its getitems carry the tensors and are what gets saved.
            must_recompute[value.name] = "multi-output op: its getitem outputs are saved or recomputed"
            if rule is not None:
                must_save[value.name] = rule
            continue
        if value.is_view:
            must_recompute[value.name] = f"view of {value.inputs[0]}: re-created from its base for free"
            continue
        if not value.is_tensor:
            must_recompute[value.name] = "not a tensor"
            continue
        if rule is not None:
            must_save[value.name] = rule
            continue
        target = nodes[value.name].target
        if _matches(target, save_targets):
            must_save[value.name] = f"save_ops: {value.op}"
            continue
        if policy is not None:
            answer = _ask(policy, value, target, costs)
            if answer is Action.SAVE:
                must_save[value.name] = "policy: SAVE"
            elif answer is Action.RECOMPUTE:
                must_recompute[value.name] = "policy: RECOMPUTE"
            elif answer is not None:
                preference[value.name] = answer
    # Multi-output producers that must be saved are kept through their outputs.
    for name in [n for n in must_save if n in must_recompute]:
        del must_save[name]
    return Constraints(
        types.MappingProxyType(must_save),
        types.MappingProxyType(must_recompute),
        types.MappingProxyType(preference),
    )


def _ask(policy: Policy, value: Value, target: object, costs: Mapping[str, int]) -> Action | None:
    info = NodeInfo(value.name, value.op, target, value.shape, value.dtype, value.nbytes,
                    costs[value.name], value.module_path)
    answer = policy(info)
    if answer is not None and not isinstance(answer, Action):
        raise TypeError(
            f"policy returned {answer!r} for node {value.name} ({value.op}); a policy must return "
            "remat.Action.SAVE, RECOMPUTE, PREFER_SAVE, PREFER_RECOMPUTE or None"
        )
    return answer
