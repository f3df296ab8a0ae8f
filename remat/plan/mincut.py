"""Min-cut solver: networkx max-flow on the value graph, weighted by bytes, swept over a recompute price, then cut
again toward the simulated peak.

Each forward value v becomes an edge v_in → v_out whose capacity is its bytes: cutting it means saving v. An edge
source → v_in priced λ·cost(v) is cut when v is recomputed. Data edges and the edges from what backward reads to the
sink are uncuttable. A minimum cut is then the plan minimising saved bytes + λ·recompute cost. λ = 0 gives the
least-saved-bytes plan; large λ gives the baseline.

Saved bytes are not the peak, though: a plan saving little may peak where what it recomputes is held again. So
peak-aware rounds follow each distinct plan of the sweep: the plan is simulated, and the values live at its peak
are weighted up — PEAK_WEIGHT× the bytes on the saving edge of each value saved and live there, PEAK_WEIGHT× its
bytes added to the recompute edge of each value backward reads that is recomputed and held there — and the cut is
made again at the same price, keeping the weights of earlier rounds, up to PEAK_ROUNDS times or until a plan
repeats. The grid and the rounds do not depend on the budget: `pick` takes the cheapest plan of the family whose
*simulated peak* meets it.
"""
from __future__ import annotations

import dataclasses

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov, build_residual_network

from ..capture import Role
from .evaluate import Evaluator, Scored
from .problem import Problem
from .simulate import BACKWARD, Timeline

SOURCE, SINK = "<source>", "<sink>"
PRICE_STEPS = tuple(2.0 ** k for k in range(-10, 11, 2))
LARGE_GRAPH = 5000  # nodes; beyond it a coarser price grid keeps planning near a second
LARGE_PRICE_STEPS = tuple(2.0 ** k for k in range(-8, 9, 4))
PEAK_ROUNDS = 4  # re-cuts after each distinct plan of the sweep
PEAK_WEIGHT = 8  # factor on a value's bytes per round it is live at the peak


def value_graph(problem: Problem) -> nx.DiGraph:
    """The flow graph without recompute prices (edges without 'capacity' are uncuttable)."""
    graph, c = problem.graph, problem.constraints
    flow = nx.DiGraph()
    flow.add_node(SOURCE)
    flow.add_node(SINK)
    for name in problem.candidates:
        value = graph[name]
        if name in c.must_recompute or not value.is_tensor:
            flow.add_edge(f"{name}/in", f"{name}/out")  # cannot be saved
        else:
            flow.add_edge(f"{name}/in", f"{name}/out", capacity=value.nbytes)
        if name in c.must_save:
            flow.add_edge(SOURCE, f"{name}/in")  # cannot be recomputed
        for inp in value.inputs:
            if graph[inp].role is Role.FORWARD:
                flow.add_edge(f"{inp}/out", f"{name}/in")
    for name in problem.needed:
        flow.add_edge(f"{name}/out", SINK)
    return flow


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
        node = next((steps[q] for q in range(p, len(steps)) if kinds[q] == BACKWARD and steps[q] in self.position),
                    None)
        if node is None:
            return []
        at = self.position[node]
        return sorted((n for n in recomputed if n in self.spans and self.spans[n][0] <= at <= self.spans[n][1]),
                      key=self.spans.__getitem__)


def held(problem: Problem) -> Held:
    graph = problem.graph
    position = {n: i for i, n in enumerate(problem.backward)}
    spans: dict[str, tuple[int, int]] = {}
    for b in problem.backward:
        for i in graph[b].inputs:
            spans[i] = (spans.get(i, (position[b],))[0], position[b])
    return Held(position, {n: spans[n] for n in problem.needed if n in spans})


class Cutter:
    """The flow graph of one problem and its residual network, built once and re-weighted for every cut (networkx
    resets its flows on every run), which saves rebuilding it for every price and round."""

    def __init__(self, problem: Problem, top_price: float):
        self.problem = problem
        self.held = held(problem)
        self.flow = value_graph(problem)
        graph = problem.graph
        self.bytes = {n: graph[n].nbytes for n in problem.candidates}
        self.saving = [n for n in problem.candidates if "capacity" in self.flow[f"{n}/in"][f"{n}/out"]]
        # Build the residual network at the highest weights, so its stand-in for "infinite" exceeds every cut.
        # (networkx leaves zero-capacity edges out of it: build with at least 1.)
        most = PEAK_WEIGHT ** PEAK_ROUNDS
        for n in self.saving:
            self.flow[f"{n}/in"][f"{n}/out"]["capacity"] = max(self.bytes[n] * most, 1)
        self.flow.add_edges_from(
            (SOURCE, f"{n}/in", {"capacity": max(self._price(top_price, n) + self.bytes[n] * most, 1)})
            for n in problem.choosable)
        self.residual = build_residual_network(self.flow, "capacity")

    def _price(self, price: float, name: str) -> int:
        return int(round(price * self.problem.solver_cost(name)))

    def cut(self, price: float, saved_at_peak: dict[str, int], held_at_peak: dict[str, int]) -> frozenset[str]:
        """The values a minimum cut recomputes at recompute price `price`, each value's bytes weighted by the
        factors of `saved_at_peak` on its saving edge and of `held_at_peak` on its recompute edge."""
        capacities = {(f"{n}/in", f"{n}/out"): self.bytes[n] * saved_at_peak.get(n, 1) for n in self.saving}
        capacities.update(((SOURCE, f"{n}/in"), self._price(price, n) + self.bytes[n] * (held_at_peak.get(n, 1) - 1))
                          for n in self.problem.choosable)
        for (u, v), capacity in capacities.items():
            self.residual[u][v]["capacity"] = capacity
            self.residual[v][u]["capacity"] = 0
        boykov_kolmogorov(self.flow, SOURCE, SINK, residual=self.residual, value_only=True)
        source_side = _reachable(self.residual)
        return frozenset(n for n in self.problem.choosable if f"{n}/in" not in source_side)


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
    return members


def peak_rounds(cutter: Cutter, evaluator: Evaluator, price: float, start: Scored,
                seen: set[frozenset[str]]) -> list[Scored]:
    """The plans cut again at `price` from `start`, each round weighting up what is live at the last plan's
    simulated peak; a plan made before ends the rounds."""
    saved_at_peak: dict[str, int] = {}
    held_at_peak: dict[str, int] = {}
    current, found = start, []
    for _ in range(PEAK_ROUNDS):
        timeline = evaluator.timeline(current.resolved)
        for n in timeline.live_at_peak():
            saved_at_peak[n] = saved_at_peak.get(n, 1) * PEAK_WEIGHT
        for n in cutter.held.at_peak(timeline, current.resolved.recomputed):
            held_at_peak[n] = held_at_peak.get(n, 1) * PEAK_WEIGHT
        chosen = cutter.cut(price, saved_at_peak, held_at_peak)
        if chosen in seen:
            break
        seen.add(chosen)
        current = evaluator.score(chosen)
        found.append(current)
    return found
