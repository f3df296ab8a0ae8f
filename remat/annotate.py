"""User intent and graph rules → constraints on what the planner may decide.

Marking (what the user or a rule wants) is kept apart from deciding (what the solver picks): this stage only says
which values must be saved, which must be recomputed, and which the user would rather save or recompute.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Callable, Mapping

import torch.fx as fx

from . import _torch
from .capture import Graph, Role, Value


class Action(enum.Enum):
    """What to do with an activation. Policies answer with one of these (or None for no opinion)."""

    SAVE = "save"
    RECOMPUTE = "recompute"
    PREFER_SAVE = "prefer_save"
    PREFER_RECOMPUTE = "prefer_recompute"
    OFFLOAD = "offload"  # save it in host memory between forward and backward
    PARTITION = "partition"  # save 1/world of it on each rank, gathered before backward uses it
    SHARD = "partition"  # the same member: remat's code calls sharding over ranks "shard" (partition= option)


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
    # Random ops recomputation may replay: name → bytes of the generator state saved to replay it.
    replay: Mapping[str, int] = dataclasses.field(default_factory=dict)
    must_offload: Mapping[str, str] = dataclasses.field(default_factory=dict)  # name → reason (policy OFFLOAD)
    kinds_saved: bool = False  # outputs of whole op kinds are kept (save_ops): the planner adds no such variants
    # Values kept only by a save list or by rng="save": without those options a plan could choose them.
    by_option: frozenset[str] = frozenset()


def _graph_rule(value: Value, graph: Graph, must_save: dict[str, str], rng: str) -> str | None:
    """Why a forward value can never be recomputed, or None."""
    if "seeded_random" in value.tags and rng == "save":
        return f'random op {value.op}: rng="save" keeps the outputs of random ops'
    if "nondeterministic_seeded" in value.tags and not _replayable(value, graph, rng):
        if rng == "save":
            return f'random op {value.op}: rng="save" keeps the outputs of random ops'
        return f"random op {value.op}: recomputing it would draw new numbers"
    if "nondeterministic_seeded" in value.tags and _output_bytes(value, graph) <= rng_state_bytes(value.device):
        return (
            f"random op {value.op}: its output ({_output_bytes(value, graph)} bytes) is no larger than the "
            f"generator state replaying it would keep ({rng_state_bytes(value.device)} bytes)"
        )
    if "collective" in value.tags:
        return f"collective {value.op}: re-running it would communicate again"
    if "mutable" in value.tags:
        return f"{value.op} mutates its input"
    if "nondeterministic_bitwise" in value.tags:
        return f"{value.op} is not bitwise deterministic"
    mutated = [i for i in value.inputs if i in graph.mutated_inputs]
    if mutated:
        return (
            f"reads input {mutated[0]}, which the step mutates in place: recomputed in backward it would read "
            "the new value"
        )
    if value.op == "getitem" and value.inputs and value.inputs[0] in must_save:
        return f"output of {value.inputs[0]}: " + must_save[value.inputs[0]]
    return None


def _replayable(value: Value, graph: Graph, rng: str) -> bool:
    """A random op backward may re-run from the generator state saved before it: an aten op on CPU or CUDA that
    the forward runs anyway (its draw must happen in forward, as in the uncompiled step). Saving the state and
    drawing are one call, so backward redraws what the forward drew wherever the inner compiler places that call;
    under inductor with fallback_random the draws keep the order plain inductor gives them. Inductor's own random
    ops draw from a seeds tensor and are recomputed from it like any pure op."""
    return (
        rng == "replay"
        and value.op.startswith("aten.")
        and value.device in RNG_DEVICES
        and value.name in graph.forward_required
    )


def _output_bytes(value: Value, graph: Graph) -> int:
    if not value.is_multi:
        return value.nbytes
    return sum(graph[u].nbytes for u in value.users if graph[u].op == "getitem")


# Bytes of the generator state a replay keeps: the CPU generator's full state; CUDA's seed and offset.
RNG_DEVICES = ("cpu", "cuda")


def rng_state_bytes(device: str) -> int:
    import torch

    return torch.get_rng_state().numel() if device == "cpu" else 16


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
            graph[u].role is Role.FORWARD and graph[u].origin != value.origin for u in value.users
        )
        owner = graph[value.storage]
        if read_on and owner.role is Role.FORWARD:
            found[owner.name] = (
                f"tensor hook registered on {value.origin}: a hooked value is kept as the forward "
                "computed it, never recomputed"
            )
    return found


def _matches(target: object, save_targets: tuple[frozenset, frozenset]) -> bool:
    packets, overloads = save_targets
    if not isinstance(target, _torch.OpOverload):
        return False
    return target in overloads or target.overloadpacket in packets


def annotate(
    joint: fx.GraphModule,
    graph: Graph,
    costs: Mapping[str, int],
    save_targets: tuple[frozenset, frozenset] = (frozenset(), frozenset()),
    policy: Policy | None = None,
    rng: str = "replay",
    regions: bool = True,
    hooked: frozenset[str] = frozenset(),
) -> Constraints:
    """Constraints for every forward value of the joint graph. `hooked` names the dynamo-graph nodes that carry a
    tensor hook (capture.hooked_nodes). Pure."""
    nodes = {n.name: n for n in joint.graph.nodes}
    must_save: dict[str, str] = {}
    must_recompute: dict[str, str] = {}
    preference: dict[str, Action] = {}
    replay: dict[str, int] = {}
    must_offload: dict[str, str] = {}
    by_option: set[str] = set()
    observed = _hooked_values(graph, hooked)
    for value in graph.values:
        if value.role is not Role.FORWARD:
            continue
        rule = _graph_rule(value, graph, must_save, rng) or observed.get(value.name)
        if rule is not None and rng == "save" and value.name not in observed and _kept_by_rng(value, graph, by_option):
            by_option.add(value.name)
        if rule is None and "nondeterministic_seeded" in value.tags:
            replay[value.name] = rng_state_bytes(value.device)
        if value.is_multi:
            # A tuple has no memory of its own; its getitems carry the tensors and are what gets saved.
            must_recompute[value.name] = "multi-output op: its getitem outputs are saved or recomputed"
            if rule is not None:
                must_save[value.name] = rule
            continue
        if value.is_view:
            must_recompute[value.name] = f"view of {value.inputs[0]}: re-created from its base for free"
            continue
        if value.is_opaque:
            must_save[value.name] = "opaque object (process group, device mesh): handed to backward as it is"
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
            by_option.add(value.name)
            continue
        if policy is not None:
            answer = _ask(policy, value, target, costs)
            if answer is Action.SAVE:
                must_save[value.name] = "policy: SAVE"
            elif answer is Action.RECOMPUTE:
                must_recompute[value.name] = "policy: RECOMPUTE"
            elif answer is Action.OFFLOAD:
                must_save[value.name] = must_offload[value.name] = "policy: OFFLOAD"
            elif answer is Action.PARTITION:
                raise ValueError(
                    f"policy returned Action.PARTITION for node {value.name} ({value.op}); "
                    "partitioning is chosen with the partition= option, not per node"
                )
            elif answer is not None:
                preference[value.name] = answer
    if regions:  # checkpoint regions the model marked: fill in what no rule above decided
        from .regions import checkpoint_regions

        marked = checkpoint_regions(joint, graph)
        for table, extra in ((must_save, marked.must_save), (must_recompute, marked.must_recompute)):
            table.update((n, why) for n, why in extra.items() if n not in must_save and n not in must_recompute)
    # Multi-output producers that must be saved are kept through their outputs.
    for name in [n for n in must_save if n in must_recompute]:
        del must_save[name]
    return Constraints(
        types.MappingProxyType(must_save),
        types.MappingProxyType(must_recompute),
        types.MappingProxyType(preference),
        types.MappingProxyType(replay),
        types.MappingProxyType(must_offload),
        kinds_saved=bool(save_targets[0] or save_targets[1]),
        by_option=frozenset(by_option),
    )


def _kept_by_rng(value: Value, graph: Graph, by_option: set[str]) -> bool:
    """Whether only rng="save" keeps `value`, which rng="replay" would leave to the planner: a random op it may
    replay, or an output of one."""
    if value.op == "getitem" and value.inputs and graph[value.inputs[0]].is_multi:
        return value.inputs[0] in by_option
    return _graph_rule(value, graph, {}, "replay") is None


def _ask(policy: Policy, value: Value, target: object, costs: Mapping[str, int]) -> Action | None:
    info = NodeInfo(
        value.name, value.op, target, value.shape, value.dtype, value.nbytes, costs[value.name], value.module_path
    )
    answer = policy(info)
    if answer is not None and not isinstance(answer, Action):
        raise TypeError(
            f"policy returned {answer!r} for node {value.name} ({value.op}); a policy must return "
            "remat.Action.SAVE, RECOMPUTE, PREFER_SAVE, PREFER_RECOMPUTE, OFFLOAD or None"
        )
    return answer
