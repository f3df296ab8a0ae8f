"""Min-cut solver: max-flow on the value graph (scipy's where the capacities fit int32, else networkx's: Cutter),
weighted by bytes, swept over a recompute price, cut again toward the simulated peak, and its lowest plans repaired
with simulated moves.

Each forward value v becomes an edge v_in → v_out whose capacity is its bytes: cutting it means saving v. An edge
source → v_in priced λ·cost(v) is cut when v is recomputed. Data edges and the edges from what backward reads to the
sink are uncuttable. A minimum cut is then the plan minimising saved bytes + λ·recompute cost. λ = 0 gives the
least-saved-bytes plan; large λ gives the baseline.

Saved bytes are not the peak, though: a plan saving little may peak where what it recomputes is held again. So
peak-aware rounds follow each distinct plan of the sweep: the plan is simulated, and the values live at its peak
are weighted up — PEAK_WEIGHT× the bytes on the saving edge of each value saved and live there, PEAK_WEIGHT× its
bytes added to the recompute edge of each value backward reads that is recomputed and held there — and the cut is
made again at the same price, keeping the weights of earlier rounds, up to PEAK_ROUNDS times or until the rounds
come back to a plan they made.

A cut still prices bytes, not the peak, and can stop a value or two above the peak a simulated walk reaches. So the
REPAIR_STARTS lowest-peak plans are repaired last: each step simulates moving one value — recomputing one of the
REPAIR_TRIES saved values live at the peak that cost least per byte (greedy's move, in greedy's order), or saving one
of the REPAIR_TRIES recomputed values held at the peak that cost most per byte — and takes the lowest-peak plan not
made before, even when the peak does not fall (a walk out of a local minimum), for as many steps as greedy's walks
take (greedy.max_steps); beyond LARGE_GRAPH nodes, where each simulation costs more, only the lowest-peak plan
(LARGE_REPAIR_STARTS). A step simulates only the moves whose floor may reach the least peak among them
(evaluate.least_peak). Two tries each way: four plan no cheaper on seeded random graphs (at greedy's budgets, the
geometric mean of their cost over two's is 1.000 under aot_eager, 1.008 under inductor, 30 graphs) in three times
the time. And greedy's peak-targeted walk (greedy.peak_walk) runs from the sweep's most-saving plan (the highest
price's), which saves all it may where recomputing costs anything. Neither walk alone reaches every peak greedy does
on seeded random graphs (benchmarks/solver_misses.py; tests/test_mincut.py). The grid, the rounds and the walks do
not depend on the budget: `pick` takes the cheapest plan of the family whose *simulated peak* meets it.
"""

from __future__ import annotations

import dataclasses
import functools

import networkx as nx
import numpy as np
from networkx.algorithms.flow import boykov_kolmogorov, build_residual_network

from . import greedy
from .arrays import FORWARD as FORWARD_ROLE
from .evaluate import Evaluator, Scored, least_peak
from .maxflow import INT32_MAX, Edges
from .problem import Problem, Resolved
from .simulate import BACKWARD, Timeline

SOURCE, SINK = "<source>", "<sink>"
PRICE_STEPS = tuple(2.0**k for k in range(-10, 11, 2))
LARGE_GRAPH = 5000  # nodes; beyond it a coarser price grid keeps planning near a second
LARGE_PRICE_STEPS = tuple(2.0**k for k in range(-8, 9, 4))
PEAK_ROUNDS = 8  # re-cuts after each distinct plan of the sweep
PEAK_WEIGHT = 4  # factor on a value's bytes per round it is live at the peak
REPAIR_STARTS = 3  # lowest-peak plans repaired
REPAIR_TRIES = 2  # values tried each way per repair step
LARGE_REPAIR_STARTS = 1  # beyond LARGE_GRAPH, where each simulation costs more


def value_graph(problem: Problem) -> nx.DiGraph:
    """The flow graph without recompute prices (edges without 'capacity' are uncuttable)."""
    flow = nx.DiGraph()
    flow.add_node(SOURCE)
    flow.add_node(SINK)
    flow.add_edges_from(_value_edges(problem))
    graph = problem.graph
    for name in _saving(problem):
        flow[f"{name}/in"][f"{name}/out"]["capacity"] = graph[name].nbytes
    return flow


def _saving(problem: Problem) -> list[str]:
    """The candidates that may be saved, in order: each has a cuttable edge v_in → v_out."""
    graph, c = problem.graph, problem.constraints
    return [n for n in problem.candidates if n not in c.must_recompute and graph[n].is_tensor]


def _value_edges(problem: Problem) -> list[tuple[str, str]]:
    """The flow graph's edges without the recompute prices' (module docstring), each once, in order."""
    names = problem.arrays.names
    return [(_node_name(u, names), _node_name(v, names)) for u, v in _edge_keys(problem)]


# The flow graph's nodes as integer keys: the source, the sink, and for the value at joint-graph position i its
# v_in (IN + 2i) and its v_out (OUT + 2i).
SOURCE_KEY, SINK_KEY, IN, OUT = 0, 1, 2, 3


def _edge_keys(problem: Problem) -> list[tuple[int, int]]:
    """_value_edges over the nodes' keys."""
    a, c = problem.arrays, problem.constraints
    index, inputs, role = a.index, a.inputs, a.role
    edges: dict[tuple[int, int], None] = {}
    for name in problem.candidates:
        i = index[name]
        edges[(IN + 2 * i, OUT + 2 * i)] = None
        if name in c.must_save:
            edges[(SOURCE_KEY, IN + 2 * i)] = None  # cannot be recomputed
        for j in inputs[i]:
            if role[j] == FORWARD_ROLE:
                edges[(OUT + 2 * j, IN + 2 * i)] = None
    for name in problem.needed:
        edges[(OUT + 2 * index[name], SINK_KEY)] = None
    return list(edges)


def _node_name(key: int, names: tuple[str, ...]) -> str:
    if key < IN:
        return SOURCE if key == SOURCE_KEY else SINK
    return f"{names[(key - IN) // 2]}/{'in' if key % 2 == 0 else 'out'}"


@dataclasses.dataclass(frozen=True)
class Held:
    """Where a recomputed value backward reads is held: from its first backward reader to its last, in positions of
    the backward nodes (problem.backward)."""

    position: dict[str, int]
    spans: dict[str, tuple[int, int]]

    def at_peak(self, timeline: Timeline, recomputed: frozenset[str]) -> list[str]:
        """The recomputed values held at the backward node `timeline` peaks at or next runs (a peak in forward
        holds none)."""
        steps, kinds, p = timeline.steps, timeline.kinds, timeline.peak_step
        if p < timeline.num_forward:
            return []
        node = next(
            (steps[q] for q in range(p, len(steps)) if kinds[q] == BACKWARD and steps[q] in self.position), None
        )
        if node is None:
            return []
        at = self.position[node]
        return sorted(
            (n for n in recomputed if n in self.spans and self.spans[n][0] <= at <= self.spans[n][1]),
            key=self.spans.__getitem__,
        )


def held(problem: Problem) -> Held:
    graph = problem.graph
    position = {n: i for i, n in enumerate(problem.backward)}
    spans: dict[str, tuple[int, int]] = {}
    for b in problem.backward:
        for i in graph[b].inputs:
            spans[i] = (spans.get(i, (position[b],))[0], position[b])
    return Held(position, {n: spans[n] for n in problem.needed if n in spans})


def held_at_peak(evaluator: Evaluator, timeline: Timeline, resolved: Resolved) -> list[str]:
    """The recomputed values whose backward copy is live at the simulated peak (held from their recomputation to
    their last reader, a backward node or a later recomputation), in schedule order."""
    if not timeline.backward_at_peak or not resolved.recomputed:
        return []  # a peak in forward holds no backward storage
    problem = evaluator.problem
    names = problem.arrays.names
    live = {names[owner] for owner in timeline.backward_at_peak}
    return [n for n in problem.candidates if n in live and n in resolved.recomputed]


class Cutter:
    """The flow graph of one problem, built once and re-weighted for every cut. A cut runs scipy's compiled max-flow
    where the capacities fit it (maxflow.py), else networkx's Boykov–Kolmogorov on a residual network built once
    (networkx resets its flows on every run): the same cut either way."""

    def __init__(self, problem: Problem, top_price: float):
        self.problem = problem
        graph = problem.graph
        self.bytes = {n: graph[n].nbytes for n in problem.candidates}
        self.saving = _saving(problem)
        self._top_price = top_price
        index = problem.arrays.index
        choosable = problem.choosable
        self._keys = keys = _edge_keys(problem) + [(SOURCE_KEY, IN + 2 * index[n]) for n in choosable]
        ids: dict[int, int] = {SOURCE_KEY: 0, SINK_KEY: 1}  # per node key: its node number, in order of first edge
        for u, v in keys:
            if u not in ids:
                ids[u] = len(ids)
            if v not in ids:
                ids[v] = len(ids)
        self._ids = ids
        self.edges = Edges(len(ids), [ids[u] for u, _ in keys], [ids[v] for _, v in keys])
        position = {edge: k for k, edge in enumerate(keys)}
        self._flow: nx.DiGraph | None = None
        self._residual: nx.DiGraph | None = None
        # `cut`'s arrays: the saving edges and their bytes; per choosable value, its recompute edge, its solver cost,
        # its bytes and its v_in node
        saving = [index[n] for n in self.saving]
        self._saving_at = np.array([position[(IN + 2 * i, OUT + 2 * i)] for i in saving], dtype=np.int64)
        self._saving_bytes = np.array([self.bytes[n] for n in self.saving], dtype=np.int64)
        choosable_in = [IN + 2 * index[n] for n in choosable]
        self._source_at = np.array([position[(SOURCE_KEY, k)] for k in choosable_in], dtype=np.int64)
        self._costs = np.array([problem.solver_cost(n) for n in choosable], dtype=np.float64)
        self._choosable_bytes = np.array([self.bytes[n] for n in choosable], dtype=np.int64)
        self._choosable_in = np.array([ids[k] for k in choosable_in], dtype=np.int64)

    @functools.cached_property
    def held(self) -> Held:
        """Where each recomputed value backward reads is held (for the peak-aware rounds)."""
        return held(self.problem)

    @property
    def flow(self) -> nx.DiGraph:
        """The flow graph for networkx's cut, built when first needed (the capacities do not fit scipy's)."""
        if self._flow is None:
            flow = value_graph(self.problem)
            # Weighted as at the highest weights, so that the residual network's stand-in for "infinite" exceeds
            # every cut. (networkx leaves zero-capacity edges out of it: build with at least 1.)
            most = PEAK_WEIGHT**PEAK_ROUNDS
            for n in self.saving:
                flow[f"{n}/in"][f"{n}/out"]["capacity"] = max(self.bytes[n] * most, 1)
            flow.add_edges_from(
                (SOURCE, f"{n}/in", {"capacity": max(self._price(self._top_price, n) + self.bytes[n] * most, 1)})
                for n in self.problem.choosable
            )
            self._flow = flow
        return self._flow

    @property
    def residual(self) -> nx.DiGraph:
        if self._residual is None:
            self._residual = build_residual_network(self.flow, "capacity")
        return self._residual

    def _price(self, price: float, name: str) -> int:
        return int(round(price * self.problem.solver_cost(name)))

    def cut(self, price: float, saved_at_peak: dict[str, int], held_at_peak: dict[str, int]) -> frozenset[str]:
        """The values a minimum cut recomputes at recompute price `price`, each value's bytes weighted by the
        factors of `saved_at_peak` on its saving edge and of `held_at_peak` on its recompute edge."""
        choosable = self.problem.choosable
        saving, recompute = self._weighted(price, saved_at_peak, held_at_peak)
        bound = int(saving.sum()) + 1
        if bound <= INT32_MAX:  # scipy's cut, its capacities set from the arrays
            values = np.full(len(self._keys), bound, dtype=np.int64)  # uncuttable edges: `bound`
            values[self._saving_at] = saving
            values[self._source_at] = recompute
            reached = self.edges.source_side(values, bound, self._ids[SOURCE_KEY], self._ids[SINK_KEY])
            if reached is not None:
                return frozenset(choosable[k] for k in np.flatnonzero(~reached[self._choosable_in]))
        capacities, _ = self.capacities(price, saved_at_peak, held_at_peak)
        source_side = self._networkx_cut(capacities)
        return frozenset(n for n in choosable if f"{n}/in" not in source_side)

    def capacities(
        self, price: float, saved_at_peak: dict[str, int], held_at_peak: dict[str, int]
    ) -> tuple[dict[tuple[str, str], int], int]:
        """The capacity of every cuttable edge for `cut`, and a bound above some cut's value: cutting every saving
        edge separates the source from the sink wherever a cut is finite, so above their sum a capacity is as good
        as infinite."""
        saving, recompute = self._weighted(price, saved_at_peak, held_at_peak)
        capacities = dict(zip(((f"{n}/in", f"{n}/out") for n in self.saving), saving.tolist()))
        bound = sum(capacities.values()) + 1
        capacities.update(zip(((SOURCE, f"{n}/in") for n in self.problem.choosable), recompute.tolist()))
        return capacities, bound

    def _weighted(
        self, price: float, saved_at_peak: dict[str, int], held_at_peak: dict[str, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(the saving edges' capacities, in `saving`'s order; the recompute edges', in the choosable values'):
        bytes times the weight of `saved_at_peak`; the price of the recompute cost (rounded half to even, as
        Python's round) plus the bytes times the weight of `held_at_peak` less one."""
        saving = self._saving_bytes
        if saved_at_peak:
            saving = saving * np.array([saved_at_peak.get(n, 1) for n in self.saving], dtype=np.int64)
        recompute = np.rint(price * self._costs).astype(np.int64)
        if held_at_peak:
            weights = np.array([held_at_peak.get(n, 1) for n in self.problem.choosable], dtype=np.int64)
            recompute += self._choosable_bytes * (weights - 1)
        return saving, recompute

    def _scipy_cut(self, capacities: dict[tuple[str, str], int], bound: int) -> set[str] | None:
        """`cut`'s scipy path over capacities keyed by node names (`capacities`), as `_networkx_cut` takes them."""
        if bound > INT32_MAX:
            return None  # no array to build: maxflow takes no capacity above int32
        names = self.problem.arrays.names
        position = {(_node_name(u, names), _node_name(v, names)): k for k, (u, v) in enumerate(self._keys)}
        values = np.full(len(position), bound, dtype=np.int64)  # uncuttable edges: `bound`
        for edge, capacity in capacities.items():
            values[position[edge]] = capacity  # maxflow lowers those above `bound` to it
        reached = self.edges.source_side(values, bound, self._ids[SOURCE_KEY], self._ids[SINK_KEY])
        if reached is None:
            return None
        return {_node_name(key, names) for key, k in self._ids.items() if reached[k]}

    def _networkx_cut(self, capacities: dict[tuple[str, str], int]) -> set[str]:
        residual = self.residual
        for (u, v), capacity in capacities.items():
            residual[u][v]["capacity"] = capacity
            residual[v][u]["capacity"] = 0
        boykov_kolmogorov(self.flow, SOURCE, SINK, residual=residual, value_only=True)
        return _reachable(residual)


def _reachable(residual: nx.DiGraph) -> set[str]:
    seen, stack = {SOURCE}, [SOURCE]
    while stack:
        u = stack.pop()
        for v, e in residual[u].items():
            if v not in seen and e["flow"] < e["capacity"]:
                seen.add(v)
                stack.append(v)
    return seen


def prices(problem: Problem) -> list[float]:
    """λ = 0, then the grid, scaled so that λ = 1 prices the choosable values' total cost as their total bytes."""
    total_bytes = sum(problem.graph[n].nbytes for n in problem.choosable) or 1
    total_cost = sum(problem.solver_cost(n) for n in problem.choosable) or 1
    steps = LARGE_PRICE_STEPS if len(problem.graph.values) > LARGE_GRAPH else PRICE_STEPS
    return [0.0] + [total_bytes / total_cost * step for step in steps]


def family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    """The price sweep's plans, each followed by its peak-aware rounds (the mincut solver's family)."""
    return _family(problem, evaluator, rounds=True)


def sweep_family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    """The price sweep's plans alone: what auto and optimal take from mincut beside greedy's proposals, whose
    plans already reach the peaks the rounds aim at, at a fraction of the planning time."""
    return _family(problem, evaluator, rounds=False)


def _family(problem: Problem, evaluator: Evaluator, rounds: bool) -> list[Scored]:
    members = [evaluator.score(())]
    if not problem.choosable:
        return members
    grid = prices(problem)
    cutter = Cutter(problem, grid[-1])
    sweep = [(price, cutter.cut(price, {}, {})) for price in grid]
    members.extend(evaluator.score(chosen) for _, chosen in sweep)
    if not rounds:
        return members
    seen: set[frozenset[str]] = set()
    for price, chosen in sweep:
        if chosen not in seen:
            seen.add(chosen)
            members.extend(peak_rounds(cutter, evaluator, price, evaluator.score(chosen), seen))
    seen.update(s.chosen for s in members)
    count = LARGE_REPAIR_STARTS if len(problem.graph.values) > LARGE_GRAPH else REPAIR_STARTS
    starts = sorted({s.chosen: s for s in members}.values(), key=lambda s: (s.peak, s.cost))[:count]
    for start in starts:
        members.extend(repair(problem, evaluator, start, seen))
    most_saving = members[len(grid)]  # the sweep's plan at the highest price
    members.extend(greedy.peak_walk(problem, evaluator, most_saving.chosen)[1:])
    return members


def peak_rounds(
    cutter: Cutter, evaluator: Evaluator, price: float, start: Scored, seen: set[frozenset[str]]
) -> list[Scored]:
    """The plans cut again at `price` from `start`, each round weighting up what is live at the last plan's
    simulated peak, that are not in `seen` (which they join); a plan these rounds made before ends them."""
    saved_weight: dict[str, int] = {}
    held_weight: dict[str, int] = {}
    current, found, made = start, [], {start.chosen}
    for _ in range(PEAK_ROUNDS):
        timeline = evaluator.timeline(current.resolved)
        for n in timeline.live_at_peak():
            saved_weight[n] = saved_weight.get(n, 1) * PEAK_WEIGHT
        for n in cutter.held.at_peak(timeline, current.resolved.recomputed):
            held_weight[n] = held_weight.get(n, 1) * PEAK_WEIGHT
        chosen = cutter.cut(price, saved_weight, held_weight)
        if chosen in made:
            break
        made.add(chosen)
        current = evaluator.score(chosen)
        if chosen not in seen:
            seen.add(chosen)
            found.append(current)
    return found


def repair(problem: Problem, evaluator: Evaluator, start: Scored, seen: set[frozenset[str]]) -> list[Scored]:
    """The plans a walk from `start` takes, one value moved per step (module docstring), none in `seen` (which they
    join); the walk ends when every move leads to a plan in `seen`, or after as many steps as greedy's walks take."""
    choosable = set(problem.choosable)
    current, found = start, []
    for _ in range(greedy.max_steps(problem)):
        timeline = evaluator.timeline(current.resolved)
        chosen = current.chosen
        ups = sorted(
            (n for n in timeline.live_at_peak() if n in choosable and n not in chosen),
            key=lambda n: greedy.ratio(problem, n),
        )
        downs = sorted(
            (n for n in held_at_peak(evaluator, timeline, current.resolved) if n in chosen),
            key=lambda n: greedy.ratio(problem, n),
            reverse=True,
        )
        moves = [chosen | {n} for n in ups[:REPAIR_TRIES]] + [chosen - {n} for n in downs[:REPAIR_TRIES]]
        moves = [m for m in moves if m not in seen]
        if not moves:
            break
        tried = [evaluator.score(m) for m in moves]
        current = least_peak(tried)  # simulates only the moves whose floor may reach the least peak
        seen.add(current.chosen)
        found.append(current)
    return found
