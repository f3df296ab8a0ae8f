"""The graph facts as flat integer arrays, indexed by joint-graph position: what the hot loops of resolve, schedule
and simulate read (the solvers call them hundreds of times per graph)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

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


class Vectors(NamedTuple):
    """Arrays' columns that whole-module array operations read (reorder._Kernels, fusion.expand_flat), as numpy
    arrays."""

    storage: np.ndarray
    nbytes: np.ndarray
    instances: np.ndarray
    allocates: np.ndarray
    # `distinct` flattened: node i's inputs are distinct_flat[distinct_start[i] : distinct_start[i + 1]]
    distinct_start: np.ndarray
    distinct_flat: np.ndarray
    role: np.ndarray
    # `getitems` flattened the same way
    getitem_start: np.ndarray
    getitem_flat: np.ndarray


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

    @functools.cached_property
    def view_mask(self) -> bytes:
        """Per node, 1 for a view: `is_view` as bytes, for whole-array masks (`either`)."""
        return bytes(self.is_view)

    @functools.cached_property
    def folding_mask(self) -> bytes:
        """Per node, 1 for an mm inductor may turn into an addmm (`folds`), as bytes."""
        return bytes(target >= 0 for target in self.folds)

    @functools.cached_property
    def loop_mask(self) -> bytes:
        """Per node, 1 for a pointwise loop that allocates (what fusion.inlined may compute inside its readers), as
        bytes."""
        return bytes(kind == fusion.POINTWISE and owns for kind, owns in zip(self.kinds, self.allocates))

    @functools.cached_property
    def allocating_more(self) -> bytes:
        """Per node, 1 for an op that allocates more than its own value: a multi-output op (its getitems) or one
        with scratch (`workspace`), as bytes."""
        return bytes(bool(items) or scratch >= 0 for items, scratch in zip(self.getitems, self.workspace))

    @functools.cached_property
    def first_backward(self) -> int:
        """The position of the first backward node (len(names): none)."""
        return next((i for i, role in enumerate(self.role) if role == BACKWARD), len(self.names))

    @functools.cached_property
    def forward_mask(self) -> bytes:
        """Per node, 1 for a forward value (role FORWARD), as bytes."""
        return bytes(role == FORWARD for role in self.role)

    @functools.cached_property
    def vectors(self) -> Vectors:
        return Vectors(
            np.array(self.storage, dtype=np.intp),
            np.array(self.nbytes, dtype=np.int64),
            np.array(self.instances, dtype=np.intp),
            np.array(self.allocates, dtype=bool),
            np.concatenate(([0], np.cumsum([len(d) for d in self.distinct]))).astype(np.intp),
            np.fromiter(itertools.chain.from_iterable(self.distinct), dtype=np.intp),
            np.array(self.role, dtype=np.int8),
            np.concatenate(([0], np.cumsum([len(g) for g in self.getitems]))).astype(np.intp),
            np.fromiter(itertools.chain.from_iterable(self.getitems), dtype=np.intp),
        )

    def flat_inputs(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct inputs of each of `nodes`, one after the other; how many each has)."""
        return _gathered(self.vectors.distinct_start, self.vectors.distinct_flat, nodes)

    def flat_getitems(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the getitems of each of `nodes`, one after the other; how many each has)."""
        return _gathered(self.vectors.getitem_start, self.vectors.getitem_flat, nodes)


def _gathered(starts: np.ndarray, flat: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The items of each of `nodes` in a flattened table (node i's are flat[starts[i] : starts[i + 1]]), one after
    the other, and how many each has."""
    first = starts[nodes]
    lengths = starts[nodes + 1] - first
    offsets = np.repeat(first - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
    return flat[offsets], lengths


def either(x: bytes | bytearray, y: bytes | bytearray) -> bytearray:
    """Per position, 1 where `x` or `y` holds 1 (masks of 0 and 1 bytes, of one length)."""
    return bytearray((int.from_bytes(x, "little") | int.from_bytes(y, "little")).to_bytes(len(x), "little"))


def arrays(graph: Graph) -> Arrays:
    """The arrays of `graph`, read in one pass over its values, a row per value (on a graph of 50k nodes, a pass per
    array spends most of its time bringing the values back into the cache)."""
    values = graph.values
    index = {v.name: i for i, v in enumerate(values)}
    by_name = graph.by_name
    n = len(values)
    # one tuple per distinct key: every array of the graph lives as long as the compiled graph does, and each
    # object that lives on is one more for Python's collector to walk
    keys: dict[tuple[str, int], tuple[str, int]] = {}

    def row(v) -> tuple:
        read = tuple(index[i] for i in v.inputs)
        distinct = tuple(dict.fromkeys(read))
        key = (v.dtype, v.nbytes)
        owner = index[v.storage]
        owner_role = values[owner].role
        target = fusion.addmm_target(graph, v)
        return (
            v.name,  # names
            _CODES[v.role],  # role
            read,  # inputs
            owner,  # storage
            v.nbytes,  # nbytes
            not v.is_view and v.nbytes > 0,  # allocates
            owner if owner_role is Role.FORWARD else owner + n if owner_role is Role.BACKWARD else -1,  # instances
            tuple(index[u] for u in v.users if by_name[u].op == "getitem") if v.is_multi else (),  # getitems
            _workspace(graph, v, index),  # workspace
            fusion.kind(v),  # kinds
            index[target] if target else -1,  # folds
            tuple(index[u] for u in v.users),  # users
            v.is_view,  # is_view
            keys.setdefault(key, key),  # reuse_keys
            BACKWARD_FORMULA in v.tags,  # formula
            v.device == "cpu" and v.op in fusion.HEAVY_CPU,  # heavy
            fusion.ACC_READS_LIMIT.get(v.device, fusion.ACC_READS_DEFAULT),  # acc_reads
            _numel(v.shape),  # numel
            read if len(distinct) == len(read) else distinct,  # distinct
            any(by_name[u].is_view for u in v.users),  # view_users
        )

    columns = list(zip(*map(row, values))) or [()] * len(_COLUMNS)
    return Arrays(index=index, **dict(zip(_COLUMNS, columns)))


# Arrays' fields in the order of arrays' rows
_COLUMNS = tuple(field.name for field in dataclasses.fields(Arrays) if field.name != "index")


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
