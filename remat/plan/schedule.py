"""Execution order of a plan. The simulator and the rewrite both use it, so what is simulated is what runs."""

from __future__ import annotations

from .arrays import BACKWARD, FORWARD
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
    order = [i for i in range(len(a.names)) if required[i] and a.role[i] == FORWARD]
    return _early(a, order) if problem.fuses else order


def _early(a, order: list[int]) -> list[int]:
    """`order` with each forward value that sits after the first backward node moved to just after the last of its
    forward inputs (values without forward inputs stay where they are)."""
    boundary = next((i for i, r in enumerate(a.role) if r == BACKWARD), len(a.names))
    if not order or order[-1] < boundary:
        return order
    key: dict[int, tuple[int, ...]] = {}  # place in the new order: an anchor's key, then the move's sequence number
    after: dict[int, list[int]] = {}  # anchor → the values moved right after it, in joint order
    for i in order:
        inputs = [j for j in a.inputs[i] if j in key]
        if i < boundary or not inputs:
            key[i] = (i,)
            continue
        anchor = max(inputs, key=key.__getitem__)
        key[i] = key[anchor] + (len(key),)
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
    for node in problem.backward_positions:
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


def forward_order(problem: Problem, resolved: Resolved) -> list[str]:
    names = problem.arrays.names
    return [names[i] for i in forward_ids(problem, resolved)]


def backward_order(problem: Problem, resolved: Resolved) -> list[str]:
    names = problem.arrays.names
    return [names[i] for i in backward_ids(problem, resolved)]
