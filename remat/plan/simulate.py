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

from ..capture import Role
from .problem import Problem, Resolved
from .schedule import backward_order, forward_order

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"


@dataclasses.dataclass(frozen=True)
class Timeline:
    steps: tuple[str, ...]  # node names: the forward schedule, then backward with recomputation inserted
    kinds: tuple[str, ...]  # "forward" | "recompute" | "backward" per step
    live: tuple[int, ...]  # live activation bytes while each step runs
    peak_bytes: int
    peak_step: int  # index into steps
    saved_bytes: int
    num_forward: int
    saved_spans: Mapping[str, tuple[int, int]]  # saved value → (allocating step, last step that reads it)

    def live_at_peak(self) -> list[str]:
        """Saved values whose storage is live at the peak step, in schedule order."""
        return [n for n, (a, b) in self.saved_spans.items() if a <= self.peak_step <= b]

    @property
    def forward_peak(self) -> int:
        return max(self.live[: self.num_forward], default=0)

    @property
    def backward_peak(self) -> int:
        return max(self.live[self.num_forward:], default=0)


def simulate(problem: Problem, resolved: Resolved) -> Timeline:
    graph = problem.graph
    fw = forward_order(problem, resolved)
    bw = backward_order(problem, resolved)
    steps = fw + bw
    recomputed = resolved.recomputed
    excluded = {graph[o].storage for o in graph.bw_outputs}

    def instance(name: str, in_backward: bool):
        """The storage a name refers to at this point: ('f', owner) or ('b', owner), None if not counted."""
        owner = graph[name].storage
        role = graph[owner].role
        if role is Role.BACKWARD or (in_backward and owner in recomputed):
            return ("b", owner)
        if role is Role.FORWARD:
            return ("f", owner)
        return None

    alloc: dict[tuple, int] = {}
    last: dict[tuple, int] = {}
    for pos, name in enumerate(steps):
        in_bw = pos >= len(fw)
        value = graph[name]
        for inp in value.inputs:
            key = instance(inp, in_bw)
            if key is not None:
                last[key] = pos
        if not value.is_view and value.nbytes:
            key = instance(name, in_bw)
            if key is not None and key not in alloc:
                alloc[key] = pos
                last.setdefault(key, pos)
    end = len(steps) - 1
    for out in graph.fw_outputs:
        key = instance(out, False)
        if key is not None:
            last[key] = end

    delta = [0] * (len(steps) + 1)
    for key, start in alloc.items():
        if key[1] in excluded:
            continue
        size = graph[key[1]].nbytes
        delta[start] += size
        delta[max(last[key], start) + 1] -= size
    live = tuple(itertools.accumulate(delta[:-1]))
    peak = max(live, default=0)
    saved_bytes = sum(graph[n].nbytes for n in resolved.saved if graph[n].storage not in excluded)
    kinds = tuple(
        FORWARD if i < len(fw) else (RECOMPUTE if n in recomputed else BACKWARD) for i, n in enumerate(steps)
    )
    spans = {n: (alloc[("f", n)], last[("f", n)]) for n in sorted(resolved.saved, key=lambda n: graph[n].index)
             if ("f", n) in alloc and n not in excluded}
    return Timeline(tuple(steps), kinds, live, peak, live.index(peak) if live else 0, saved_bytes, len(fw),
                    types.MappingProxyType(spans))
