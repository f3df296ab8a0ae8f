"""Execution order of a plan. The simulator and the rewrite both use it, so what is simulated is what runs."""

from __future__ import annotations

import bisect

import numpy as np

from .arrays import FORWARD
from .problem import Problem, Resolved


def forward_ids(problem: Problem, resolved: Resolved) -> list[int]:
    """Forward values the forward module computes — what the outputs need plus what is saved — in schedule order.

    Under inductor, a value the joint graph traces in its backward part but computes from forward values alone (a
    gradient formula's factor its min-cut partition saves instead of its inputs, such as GELU's derivative) runs as
    soon as its inputs exist, not after the whole forward: inductor fuses it with their other readers, and the
    forward module is handed to inductor in this order (rewrite.split.run_early). Elsewhere the joint graph's
    order stands: op by op, computing such a value early only trades its bytes for its inputs'."""
    a = problem.arrays
    required = bytearray(problem.fw_required_mask)
    stack = [a.index[n] for n in resolved.saved]
    while stack:
        i = stack.pop()
        if required[i]:
            continue
        required[i] = 1
        stack.extend(j for j in a.inputs[i] if a.role[j] == FORWARD and not required[j])
    order = np.flatnonzero(np.frombuffer(required, dtype=np.uint8) & np.frombuffer(a.forward_mask, dtype=np.uint8))
    order = order.tolist()
    return _early(a, order) if problem.fuses else order


def _early(a, order: list[int]) -> list[int]:
    """`order` (ascending positions) with each forward value that sits after the first backward node moved to just
    after the last of its forward inputs (values without forward inputs stay where they are)."""
    boundary = a.first_backward
    if not order or order[-1] < boundary:
        return order
    member = bytearray(len(a.names))  # in `order`: a node's inputs in it come before it
    for i in order:
        member[i] = 1
    # place in the new order of a moved value: its anchor's place, then the move's sequence number
    key: dict[int, tuple[int, ...]] = {}

    def place(j: int) -> tuple[int, ...]:
        return key.get(j) or (j,)  # a value that stays keeps its position

    after: dict[int, list[int]] = {}  # anchor → the values moved right after it, in joint order
    moves = 0
    for i in order[bisect.bisect_left(order, boundary) :]:
        inputs = [j for j in a.inputs[i] if member[j]]
        if not inputs:
            continue
        anchor = max(inputs, key=place)
        key[i] = place(anchor) + (len(order) + moves,)
        moves += 1
        after.setdefault(anchor, []).append(i)
    moved = {i for group in after.values() for i in group}
    out: list[int] = []
    stack = [i for i in reversed(order) if i not in moved]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(reversed(after.get(i, ())))
    return out


def backward_ids(problem: Problem, resolved: Resolved) -> list[int]:
    """Backward nodes in schedule order, each recomputed value placed just before its first use.

    A recomputed chain is emitted depth-first, inputs in argument order, immediately ahead of the first backward node
    that reads it, so it is live only from there to its last use. A recomputed multi-output op is followed at once by
    all its recomputed outputs (getitems), as its outputs are allocated when it runs.
    """
    a = problem.arrays
    inputs_of, getitems = a.inputs, a.getitems
    pending = bytearray(len(a.names))  # 1: recomputed and not yet emitted
    for n in resolved.recomputed:
        pending[a.index[n]] = 1
    order: list[int] = []
    positions = problem.backward_positions
    for node, reads_pending in zip(positions, _reading(problem, pending)):
        if not reads_pending:
            order.append(node)
            continue
        for root in inputs_of[node]:
            if not pending[root]:
                continue
            stack = [(root, False)]
            while stack:
                i, expanded = stack.pop()
                if expanded:
                    if pending[i]:
                        pending[i] = 0
                        order.append(i)
                        # A multi-output op's outputs exist from the moment it runs: take every recomputed one
                        # right away, so the tuple is released at once and each output lives from here.
                        for g in getitems[i]:
                            if pending[g]:
                                pending[g] = 0
                                order.append(g)
                    continue
                if not pending[i]:
                    continue
                stack.append((i, True))
                for j in reversed(inputs_of[i]):
                    if pending[j]:
                        stack.append((j, False))
        order.append(node)
    return order


def _reading(problem: Problem, pending: bytearray) -> list[bool]:
    """Per backward node (Problem.backward_positions), whether it reads a value `pending` marks: only those can
    emit recomputation ahead of them."""
    inputs, reader = problem.graph_fact("backward inputs", _backward_inputs)
    hit = np.frombuffer(pending, dtype=np.uint8)[inputs].astype(bool)
    return (np.bincount(reader[hit], minlength=len(problem.backward_positions)) > 0).tolist()


def _backward_inputs(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """The distinct inputs of the backward nodes one after the other, and the backward node (its place in
    Problem.backward_positions) reading each."""
    inputs, lengths = problem.arrays.flat_inputs(np.asarray(problem.backward_positions, dtype=np.intp))
    return inputs, np.repeat(np.arange(len(lengths)), lengths)


def forward_order(problem: Problem, resolved: Resolved) -> list[str]:
    names = problem.arrays.names
    return [names[i] for i in forward_ids(problem, resolved)]


def backward_order(problem: Problem, resolved: Resolved) -> list[str]:
    names = problem.arrays.names
    return [names[i] for i in backward_ids(problem, resolved)]
