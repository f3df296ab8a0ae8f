"""The graph facts as flat integer arrays, indexed by joint-graph position: what the hot loops of resolve, schedule
and simulate read (the solvers call them hundreds of times per graph)."""

from __future__ import annotations

import dataclasses
import math

from ..capture import BACKWARD_FORMULA, Graph, Role
from . import fusion

PRIMAL, TANGENT, FORWARD, BACKWARD, OUTPUT = range(5)
_CODES = {
    Role.PRIMAL: PRIMAL,
    Role.TANGENT: TANGENT,
    Role.FORWARD: FORWARD,
    Role.BACKWARD: BACKWARD,
    Role.OUTPUT: OUTPUT,
}


@dataclasses.dataclass(frozen=True)
class Arrays:
    names: tuple[str, ...]
    index: dict[str, int]
    role: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]
    storage: tuple[int, ...]
    nbytes: tuple[int, ...]
    allocates: tuple[bool, ...]  # owns storage with bytes (not a view, not empty)
    # The storage instance a node refers to when nothing is recomputed: its owner's index for a forward owner,
    # owner + len(names) for a backward owner, -1 for inputs, tangents and other uncounted storage.
    instances: tuple[int, ...]
    getitems: tuple[tuple[int, ...], ...]  # per node: its getitem users (the outputs of a multi-output op)
    # per node: a value whose size the op needs as scratch while it runs (-1: none); see _workspace.
    workspace: tuple[int, ...]
    # inductor's view of each op (fusion.kind) and, for an mm it turns into an addmm, the add's position (-1: none)
    kinds: tuple[int, ...] = ()
    folds: tuple[int, ...] = ()
    users: tuple[tuple[int, ...], ...] = ()
    is_view: tuple[bool, ...] = ()
    reuse_keys: tuple[tuple[str, int], ...] = ()  # (dtype, bytes): which freed buffer inductor may reuse for it
    formula: tuple[bool, ...] = ()  # traced in the backward pass (a gradient formula's sin(x)): capture's marker
    heavy: tuple[bool, ...] = ()  # an op inductor writes out when several kernels read it (fusion.HEAVY_CPU)
    acc_reads: tuple[int, ...] = ()  # buffers a loop may read before inductor writes it out (fusion.ACC_READS_LIMIT)
    numel: tuple[int, ...] = ()  # elements of the (first) tensor a node returns: a loop's iteration size
    distinct: tuple[tuple[int, ...], ...] = ()  # per node: its inputs without repeats, in argument order
    view_users: tuple[bool, ...] = ()  # per node: a view reads it (fusion._readers looks through views)


def arrays(graph: Graph) -> Arrays:
    index = {v.name: i for i, v in enumerate(graph.values)}
    n = len(graph.values)

    def instance(v) -> int:
        owner = index[v.storage]
        role = graph.values[owner].role
        return owner if role is Role.FORWARD else owner + n if role is Role.BACKWARD else -1

    return Arrays(
        names=tuple(v.name for v in graph.values),
        index=index,
        role=tuple(_CODES[v.role] for v in graph.values),
        inputs=tuple(tuple(index[i] for i in v.inputs) for v in graph.values),
        storage=tuple(index[v.storage] for v in graph.values),
        nbytes=tuple(v.nbytes for v in graph.values),
        allocates=tuple(not v.is_view and v.nbytes > 0 for v in graph.values),
        instances=tuple(instance(v) for v in graph.values),
        workspace=tuple(_workspace(graph, v, index) for v in graph.values),
        getitems=tuple(
            tuple(index[u] for u in v.users if graph[u].op == "getitem") if v.is_multi else () for v in graph.values
        ),
        kinds=tuple(fusion.kind(v) for v in graph.values),
        folds=tuple(index[t] if (t := fusion.addmm_target(graph, v)) else -1 for v in graph.values),
        users=tuple(tuple(index[u] for u in v.users) for v in graph.values),
        is_view=tuple(v.is_view for v in graph.values),
        reuse_keys=tuple((v.dtype, v.nbytes) for v in graph.values),
        formula=tuple(BACKWARD_FORMULA in v.tags for v in graph.values),
        heavy=tuple(v.device == "cpu" and v.op in fusion.HEAVY_CPU for v in graph.values),
        acc_reads=tuple(fusion.ACC_READS_LIMIT.get(v.device, fusion.ACC_READS_DEFAULT) for v in graph.values),
        numel=tuple(_numel(v.shape) for v in graph.values),
        distinct=tuple(tuple(dict.fromkeys(index[i] for i in v.inputs)) for v in graph.values),
        view_users=tuple(any(graph[u].is_view for u in v.users) for v in graph.values),
    )


def _numel(shape) -> int:
    return math.prod(shape) if all(isinstance(size, int) for size in shape) else 0


def _workspace(graph: Graph, v, index: dict[str, int]) -> int:
    """Scratch of the CPU kernels that allocate more than their outputs, as benchmarks/op_scratch.py measures them:
    dropout draws its mask as a float tensor the size of its output; dropout's backward converts the mask to a
    float tensor the size of the gradient before multiplying."""
    if v.device != "cpu":
        return -1
    if v.op == "aten.native_dropout.default":
        first = [u for u in v.users if graph[u].op == "getitem"]
        return index[first[0]] if first else -1
    if v.op == "aten.native_dropout_backward.default":
        return index[v.name]
    return -1
