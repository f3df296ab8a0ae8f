"""(joint graph, plan) → memory timeline of the forward+backward schedule.

What is counted is what DESIGN.md calls activation memory: every storage the step allocates — forward activations,
saved values, recomputed values, backward temporaries — while parameters, inputs, tangents and the gradients the
step returns are left out. A storage is live from the node that allocates it to the last node that reads it or any
view of it; saved storages live on into backward until their last backward reader; forward outputs stay alive to the
end of the step (the caller holds them). Views allocate nothing.
"""
from __future__ import annotations

import dataclasses
import itertools
import types
from typing import Mapping

from .arrays import BACKWARD as BACKWARD_ROLE
from .problem import Problem, Resolved
from .schedule import backward_ids, forward_ids

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"


@dataclasses.dataclass(frozen=True)
class Timeline:
    step_ids: tuple[int, ...]  # joint-graph positions: the forward schedule, then backward with recomputation
    names: tuple[str, ...] = dataclasses.field(repr=False)  # node name of every joint-graph position
    recomputed: frozenset[str] = dataclasses.field(repr=False)
    live: tuple[int, ...]  # live activation bytes while each step runs
    peak_bytes: int
    peak_step: int  # index into steps
    saved_bytes: int
    num_forward: int
    saved_spans: Mapping[str, tuple[int, int]]  # saved value → (allocating step, last step that reads it)

    @property
    def steps(self) -> tuple[str, ...]:
        """Node names per step."""
        return tuple(self.names[i] for i in self.step_ids)

    @property
    def kinds(self) -> tuple[str, ...]:
        """"forward" | "recompute" | "backward" per step."""
        return tuple(FORWARD if p < self.num_forward else RECOMPUTE if name in self.recomputed else BACKWARD
                     for p, name in enumerate(self.steps))

    def live_at_peak(self) -> list[str]:
        """Saved values whose storage is live at the peak step, in schedule order."""
        return [n for n, (a, b) in self.saved_spans.items() if a <= self.peak_step <= b]

    @property
    def forward_peak(self) -> int:
        return max(self.live[: self.num_forward], default=0)

    @property
    def backward_peak(self) -> int:
        return max(self.live[self.num_forward:], default=0)


@dataclasses.dataclass(frozen=True)
class Lifetimes:
    """When each counted storage of a plan is live: the schedule and, per storage instance, its steps."""

    fw: list[int]  # forward schedule (joint-graph positions)
    bw: list[int]  # backward schedule, recomputation included
    spans: list[tuple[int, int, int]]  # (owner position, first step, last step) per counted storage instance
    saved_spans: dict[str, tuple[int, int]]


def lifetimes(problem: Problem, resolved: Resolved) -> Lifetimes:
    """Live intervals of every storage the step allocates under a plan. Parameters, inputs, tangents and the
    gradients the step returns are left out."""
    a = problem.arrays
    n = len(a.names)
    fw = forward_ids(problem, resolved)
    bw = backward_ids(problem, resolved)
    role, storage, inputs_of, allocates = a.role, a.storage, a.inputs, a.allocates
    recomputed = bytearray(n)
    for name in resolved.recomputed:
        recomputed[a.index[name]] = 1
    excluded = {storage[a.index[o]] for o in problem.graph.bw_outputs}

    # A storage instance is its owner's index (the forward copy) or owner + n (a copy made in backward).
    plain = problem.instances  # instance outside recomputation, per node (-1: not counted)
    alloc = [-1] * (2 * n)
    last = [-1] * (2 * n)
    allocated: list[int] = []
    num_fw = len(fw)
    for pos, i in enumerate(fw):
        for j in inputs_of[i]:
            k = plain[j]
            if k >= 0:
                last[k] = pos
        if allocates[i] and alloc[i] < 0:
            alloc[i] = pos
            allocated.append(i)
            if last[i] < 0:
                last[i] = pos
    for pos, i in enumerate(bw, start=num_fw):
        for j in inputs_of[i]:
            o = storage[j]
            k = o + n if recomputed[o] else plain[j]
            if k >= 0:
                last[k] = pos
        if allocates[i]:
            k = i + n if recomputed[i] or role[i] == BACKWARD_ROLE else plain[i]
            if k >= 0 and alloc[k] < 0:
                alloc[k] = pos
                allocated.append(k)
                if last[k] < 0:
                    last[k] = pos
    end = num_fw + len(bw) - 1
    for out in problem.graph.fw_outputs:
        k = plain[a.index[out]]
        if k >= 0:
            last[k] = end
    spans = [(k % n, alloc[k], last[k]) for k in allocated if k % n not in excluded]
    saved = sorted(a.index[s] for s in resolved.saved)
    saved_spans = {a.names[i]: (alloc[i], last[i]) for i in saved if alloc[i] >= 0 and i not in excluded}
    return Lifetimes(fw, bw, spans, saved_spans)


def simulate(problem: Problem, resolved: Resolved) -> Timeline:
    a = problem.arrays
    life = lifetimes(problem, resolved)
    steps = life.fw + life.bw
    delta = [0] * (len(steps) + 1)
    nbytes = a.nbytes
    for owner, first, final in life.spans:
        delta[first] += nbytes[owner]
        delta[final + 1] -= nbytes[owner]
    live = tuple(itertools.accumulate(delta[:-1]))
    peak = max(live, default=0)
    saved_bytes = sum(nbytes[a.index[s]] for s in life.saved_spans)
    return Timeline(tuple(steps), a.names, resolved.recomputed, live, peak, live.index(peak) if live else 0,
                    saved_bytes, len(life.fw), types.MappingProxyType(life.saved_spans))
