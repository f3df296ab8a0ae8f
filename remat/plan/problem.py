"""The planning problem: what every solver and the simulator read, derived once per graph.

A plan is described by the set of forward values the solver chose to recompute. `resolve` turns that choice into the
values actually saved and actually recomputed in backward: starting from what backward reads, a value is recomputed
if chosen (its inputs are then needed too) and saved otherwise. Views and multi-output producers are always
recomputed (they own no memory); must-save values never are.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Iterable, Mapping, TypeVar

import numpy as np

from .. import _torch
from ..annotate import PREFERENCE_SCALE, Constraints
from ..capture import Graph, Role
from ..runtime import table
from . import bounds, fusion, pool, walks
from .arrays import FORWARD, Arrays, arrays
from .replication import rank_local
from .transfer import Transfer, eligible, hides_offload


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A choice made concrete: which forward values backward gets by saving, which by recomputing."""

    saved: frozenset[str]
    recomputed: frozenset[str]
    inputs: frozenset[str] = frozenset()  # forward inputs (primals) backward reads; never counted as activations
    offloaded: frozenset[str] = frozenset()  # saved values kept in host memory between forward and backward
    sharded: frozenset[str] = frozenset()  # saved values kept as 1/world per rank, gathered for backward

    @property
    def moves(self) -> dict[str, table.Move]:
        """Each saved value that leaves the device, with how it travels (runtime/table.py)."""
        moves = table.MOVES
        return {**dict.fromkeys(self.offloaded, moves["offload"]), **dict.fromkeys(self.sharded, moves["partition"])}


@dataclasses.dataclass(frozen=True)
class BaselineSpec:
    """What the inner compiler alone would save: the plan `memory_budget=None` runs and fraction 1.0 resolves to.
    Either an exact saved set (inductor, aot_eager: the nodes torch's min-cut partitioner saves) or a choice of
    values to recompute (the default partition: none, plus what checkpoint regions in the model recompute)."""

    kind: str = "default partition"
    saved: frozenset[str] | None = None
    chosen: frozenset[str] = frozenset()


T = TypeVar("T")
GRAPH_FACTS: list[str] = []  # the names of Problem's _graph_fact properties, in order of definition


def _graph_fact(build: Callable[[Any], T]) -> functools.cached_property[T]:
    """A cached property that reads the graph, its arrays and the transfer options alone, never the constraints:
    kept in the problem's graph_memo, which its variants share (Problem.constrained)."""
    name = build.__name__
    GRAPH_FACTS.append(name)

    @functools.wraps(build)
    def get(problem: Any) -> T:
        return problem.graph_fact(name, build)

    return functools.cached_property(get)


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    graph: Graph
    costs: Mapping[str, int]
    constraints: Constraints
    forward: tuple[str, ...]  # forward values in schedule order
    backward: tuple[str, ...]  # backward nodes that reach a gradient output, in schedule order
    needed: tuple[str, ...]  # forward values that backward nodes read directly, in schedule order
    candidates: tuple[str, ...]  # forward values backward may need (ancestors of `needed`), in schedule order
    choosable: tuple[str, ...]  # candidates a solver may choose to recompute (tensor, not forced either way)
    fw_required: frozenset[str]  # forward values the forward outputs depend on
    needed_inputs: tuple[str, ...]  # forward inputs (primals) that backward nodes read directly
    arrays: Arrays  # the same facts as integer arrays, for the hot loops
    transfer: Transfer = Transfer()
    offloadable: frozenset[str] = frozenset()  # values offload="auto" sends to host when saved
    fuses: bool = False  # the inner compiler fuses (inductor): the simulation follows fusion.py
    baseline: BaselineSpec = BaselineSpec()
    # Values that may differ across the shard group's ranks (replication.rank_local), never sharded.
    rank_local: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # inductor may fuse a recomputed loop with an earlier one (this torch lacks the fusion barrier, so recomputation
    # runs where inductor's fusion puts it): the simulation hoists it (simulate._hoist).
    hoists: bool = False

    @property
    def instances(self) -> tuple[int, ...]:
        return self.arrays.instances

    @property
    def forced(self) -> frozenset[str]:
        return frozenset(self.constraints.must_recompute)

    def solver_cost(self, name: str) -> float:
        """Recompute cost as solvers weigh it: the flop cost scaled by a soft user preference."""
        return self._solver_costs[name]

    def solver_costs(self, names: Iterable[str]) -> float:
        """The solver costs of `names` summed (solver_cost of each), rounded once: the same in any order."""
        return math.fsum(map(self._solver_costs.__getitem__, names))

    def solver_costs_at(self, positions: Iterable[int]) -> float:
        """solver_costs of the values at `positions`."""
        return math.fsum(map(self._solver_cost_at.__getitem__, positions))

    @_graph_fact
    def sole_readers(self) -> dict[tuple[int, tuple[int, ...]], bool]:
        """The simulation's memo of which loops depend on which (inplace._sole_reader): a fact of the graph, asked
        again by every plan simulated."""
        return {}

    @functools.cached_property
    def graph_memo(self) -> dict[str, Any]:
        """Facts of the graph, by name, derived once for a problem and its variants (`constrained`): the properties
        made with _graph_fact, and what other modules derive (recipes.blocks)."""
        return {}

    @functools.cached_property
    def _solver_costs(self) -> dict[str, float]:
        # Made once per problem: the solvers ask for it for every value of every plan they score.
        preference, costs = self.constraints.preference, self.costs
        scaled = {}
        for name in costs:
            chosen = preference.get(name)
            scaled[name] = costs[name] * (1.0 if chosen is None else PREFERENCE_SCALE.get(chosen, 1.0))
        return scaled

    @functools.cached_property
    def _solver_cost_at(self) -> list[float]:
        """solver_cost per position."""
        scaled = self._solver_costs
        return [scaled.get(name, 0.0) for name in self.arrays.names]

    @functools.cached_property
    def _forced(self) -> tuple[frozenset[int], frozenset[int]]:
        """Positions of the must-recompute and of the must-save values."""
        index = self.arrays.index
        return (
            frozenset(index[n] for n in self.constraints.must_recompute),
            frozenset(index[n] for n in self.constraints.must_save),
        )

    @_graph_fact
    def backward_positions(self) -> tuple[int, ...]:
        """Positions of the backward nodes (`backward`), in schedule order."""
        index = self.arrays.index
        return tuple(index[n] for n in self.backward)

    @_graph_fact
    def fw_required_mask(self) -> bytes:
        """Per position, 1 for the forward values the forward outputs depend on (`fw_required`)."""
        mask = bytearray(len(self.arrays.names))
        for n in self.fw_required:
            mask[self.arrays.index[n]] = 1
        return bytes(mask)

    @functools.cached_property
    def walk_values(self) -> int:
        """The values a plan could choose were none kept by a save list or by rng="save" (the family's variants keep
        theirs so, family.py). greedy's walks size their steps by it: the walk of a problem keeping such values then
        takes the steps of the walk without them until that one recomputes one of them, and shares its plans."""
        c, graph = self.constraints, self.graph
        kept = sum(1 for n in self.candidates if n in c.by_option and n not in c.must_recompute and graph[n].is_tensor)
        return len(self.choosable) + kept

    @_graph_fact
    def takes_freed(self) -> tuple[bool, ...]:
        """Per position, whether inductor allocates the value's buffer, so that it may take one freed before
        (pool.allocated_by_inductor, pool.reuse)."""
        graph, fallbacks = self.graph, _torch.inductor_fallback_ops()
        return tuple(pool.allocated_by_inductor(graph, v, fallbacks) for v in graph.values)

    @_graph_fact
    def reads_unpacked(self) -> frozenset[str]:
        """The forward values whose forward readers, were the value packed (contiguous=True), read it rather than
        its arena copy (fusion.read_by_a_loop; under inductor only): a fact of the graph, read by every plan
        simulated and by the rewrite."""
        if not (self.transfer.contiguous and self.fuses):
            return frozenset()
        a = self.arrays
        forward = bytearray(role == FORWARD for role in a.role)
        return frozenset(a.names[i] for i in range(len(a.names)) if forward[i] and fusion.read_by_a_loop(a, i, forward))

    @_graph_fact
    def library_calls(self) -> tuple[bounds.Call, ...]:
        """The backward library calls the arena floor counts (bounds.library_calls): a fact of the graph."""
        return bounds.library_calls(self)

    @_graph_fact
    def counted_bytes(self) -> tuple[int, ...]:
        """Per position: its bytes where the simulation counts it as a storage, else 0 (bounds.counted_bytes)."""
        return bounds.counted_bytes(self)

    @_graph_fact
    def forward_bits(self) -> list[int]:
        """The bits the backward floor numbers forward storages by (bounds.forward_bits)."""
        return bounds.forward_bits(self)

    @_graph_fact
    def forward_sizes(self) -> np.ndarray:
        """The bytes of the forward storages by their bits (bounds.forward_sizes): backward_floor sums them under a
        mask."""
        return bounds.forward_sizes(self)

    @_graph_fact
    def later_calls(self) -> tuple[bounds.Later, ...]:
        """The backward library calls the backward floor counts (bounds.later_calls): a fact of the graph."""
        return bounds.later_calls(self)

    @_graph_fact
    def excluded_storages(self) -> frozenset[int]:
        """Positions of the storages of the gradients the step returns (never counted as activations)."""
        a = self.arrays
        return frozenset(a.storage[a.index[o]] for o in self.graph.bw_outputs)

    def graph_fact(self, name: str, build: Callable[["Problem"], T]) -> T:
        """The fact of the graph `name` in graph_memo, made by `build(self)` when first asked for: it must read the
        graph, its arrays and the transfer options alone, as the problem's variants share it."""
        memo = self.graph_memo
        if name not in memo:
            memo[name] = build(self)
        return memo[name]

    def constrained(self, constraints: Constraints, choosable: tuple[str, ...]) -> "Problem":
        """The same problem under other constraints and choosable values, sharing its facts of the graph
        (_graph_fact) through their common graph_memo."""
        other = dataclasses.replace(self, constraints=constraints, choosable=choosable)
        other.__dict__["graph_memo"] = self.graph_memo
        return other

    def resolve(self, chosen: Iterable[str]) -> Resolved:
        return self.resolve_recomputing(self.recomputing(chosen))

    def recomputing(self, chosen: Iterable[str]) -> frozenset[int]:
        """Positions of the values a plan choosing `chosen` may recompute: the chosen ones and the must-recompute
        ones, less the must-save ones. What `resolve` walks from."""
        index = self.arrays.index
        must_recompute, must_save = self._forced
        recompute = set(map(index.__getitem__, chosen))
        recompute |= must_recompute
        recompute -= must_save
        return frozenset(recompute)

    def resolve_recomputing(self, recompute: frozenset[int]) -> Resolved:
        """The plan recomputing what backward needs of the positions `recompute` (`recomputing`'s answer)."""
        return self.resolved_of(self.walk(recompute))

    def walk(self, recompute: frozenset[int]) -> walks.Walk:
        """The walk `resolve_recomputing` makes (walks.py): the plan's values by position and by name."""
        return self.graph_fact("walks", _walks).walk(recompute)

    def resolved_of(self, walk: walks.Walk) -> Resolved:
        """The plan a walk finds."""
        saved, recomputed, inputs = walk.names
        offloaded, sharded = self._transfers(saved)
        return Resolved(saved, recomputed, self._needed_input_names | inputs, offloaded, sharded)

    @functools.cached_property
    def _needed_input_names(self) -> frozenset[str]:
        return frozenset(self.needed_inputs)

    @property
    def walk_facts(self) -> tuple:
        """What `resolve_recomputing` reads besides its argument: problems with equal facts resolve the same
        positions to the same plan (a family's variants, which differ in what they keep saved, share them)."""
        c = self.constraints
        return (
            id(self.arrays),
            self.needed,
            self.needed_inputs,
            self.transfer,
            self.offloadable,
            dict(c.must_offload),
            dict(self.rank_local),
        )

    def resolve_saved(self, saved: Iterable[str]) -> Resolved:
        """The plan that saves exactly `saved` (forward values, views and symbolic sizes included, primals count as
        inputs) and recomputes whatever else backward reads, as another partitioner decided it."""
        a = self.arrays
        keep = {a.index[n] for n in saved if n in a.index}
        return self.resolve_recomputing(frozenset(i for i, r in enumerate(a.role) if r == FORWARD and i not in keep))

    def saved_owners(self, resolved: Resolved) -> frozenset[str]:
        """The saved values with each saved view of a forward value replaced by its base, whose storage it keeps
        (torch's min-cut partitioner saves such views): what a plan's decisions list as saved."""
        graph = self.graph
        return frozenset(
            graph[n].storage if graph[graph[n].storage].role is Role.FORWARD else n for n in resolved.saved
        )

    def _transfers(self, saved: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
        t = self.transfer
        forced = saved & self.constraints.must_offload.keys()
        if not t.active:
            return frozenset(forced), frozenset()
        offload = set(forced)
        if t.offload is True:
            offload |= {n for n in saved if eligible(self.graph, n)}
        elif t.offload == "auto":
            offload |= saved & self.offloadable
        shard = (
            {n for n in saved - offload if eligible(self.graph, n) and n not in self.rank_local}
            if t.world > 1
            else set()
        )
        return frozenset(offload), frozenset(shard)


def _walks(problem: Problem) -> walks.Walks:
    """The walks resolving the problem's choices, shared by its variants (Problem.graph_fact): they read the graph's
    arrays and what backward reads alone."""
    index = problem.arrays.index
    return walks.Walks(problem.arrays, tuple(index[n] for n in problem.needed))


def build_problem(
    graph: Graph,
    costs: Mapping[str, int],
    constraints: Constraints,
    transfer: Transfer = Transfer(),
    fuses: bool = False,
    baseline: BaselineSpec = BaselineSpec(),
    hoists: bool = False,
) -> Problem:
    """Derive the structures every solver shares. Pure."""
    forward = tuple(v.name for v in graph.values if v.role is Role.FORWARD)
    reaches_grad = _ancestors(graph, graph.bw_outputs, lambda r: r is Role.BACKWARD)
    backward = tuple(v.name for v in graph.values if v.role is Role.BACKWARD and v.name in reaches_grad)
    value = graph.by_name
    needed_set = {i for b in backward for i in value[b].inputs if value[i].role is Role.FORWARD}
    # Forward outputs that backward reads count as needed too (they are kept alive anyway).
    needed = tuple(n for n in forward if n in needed_set)
    cand_set = _ancestors(graph, needed, lambda r: r is Role.FORWARD)
    candidates = tuple(n for n in forward if n in cand_set)
    c = constraints
    choosable = tuple(
        n for n in candidates if n not in c.must_save and n not in c.must_recompute and graph[n].is_tensor
    )
    fw_required = frozenset(_ancestors(graph, graph.fw_outputs, lambda r: r is Role.FORWARD))
    read = {i for b in backward for i in value[b].inputs if value[i].role is Role.PRIMAL}
    needed_inputs = tuple(v.name for v in graph.values if v.name in read)
    local = rank_local(graph, transfer.group) if transfer.world > 1 else {}
    return Problem(
        graph,
        costs,
        constraints,
        forward,
        backward,
        needed,
        candidates,
        choosable,
        fw_required,
        needed_inputs,
        arrays(graph),
        transfer,
        hides_offload(graph, costs, transfer),
        fuses,
        baseline,
        local,
        fuses and hoists,
    )


def _ancestors(graph: Graph, roots: Iterable[str], keep) -> set[str]:
    """Roots and their ancestors, following only nodes whose role satisfies `keep`."""
    seen: set[str] = set()
    stack = [r for r in roots if keep(graph[r].role)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(i for i in graph[name].inputs if keep(graph[i].role) and i not in seen)
    return seen
