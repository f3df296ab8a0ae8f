"""When each storage instance of a plan is allocated and read: the first pass of simulate.lifetimes, over both
modules' schedules as whole-array steps.

A storage instance is a forward owner's position (its forward copy), or an owner's position + n (n: the graph's node
count) for a storage allocated in backward: a backward value's, or the copy recomputation makes. A step whose
node is computed inside a later kernel of its module reads nothing there; under inductor a node reads what the values
computed inside it read (fusion.expand). A multi-output op allocates its outputs when it runs, not when a getitem
picks them up: in the forward those the forward computes, in the backward the recomputed ones and the backward
values.

Pure functions of the graph arrays and the schedules.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import fusion
from .arrays import BACKWARD as BACKWARD_ROLE


class Steps(NamedTuple):
    """Per storage instance (2n of them): the step allocating it (-1: none); the last step reading it in the
    forward, and in the whole step (its allocating step where nothing reads it; -1: neither); the first backward step
    reading it (-1: none). And the instances allocated, in step order."""

    alloc: list[int]
    last_fw: list[int]
    last: list[int]
    first_bw: list[int]
    allocated: list[int]


def steps(a, forward, backward, in_fw: bytearray, recomputed: bytearray, fuses: bool) -> Steps:
    """When each storage instance is allocated and read (module docstring) over the two modules: `forward`,
    `backward`: each its schedule, the values computed inside its kernels and fusion.expand's memo; `in_fw`: the
    forward's nodes; `recomputed`: the recomputed positions; `fuses`: under inductor."""
    v = a.vectors
    n = len(a.names)
    rec = np.frombuffer(recomputed, dtype=np.uint8).astype(bool)
    alloc = np.full(2 * n, -1, dtype=np.intp)
    last = np.full(2 * n, -1, dtype=np.intp)
    allocated: list[int] = []
    last_fw = last
    first_bw = np.full(2 * n, -1, dtype=np.intp)
    start = 0
    for backward_module, (order, inside, memo) in enumerate((forward, backward)):
        nodes, ran_at, read, read_step = _reads(a, order, inside, memo, fuses, start)
        if backward_module:
            owner = v.storage[read]
            instance = np.where(rec[owner], owner + n, v.instances[read])
        else:
            instance = v.instances[read]
        counted = instance >= 0
        instance, read_step = instance[counted], read_step[counted]
        np.maximum.at(last, instance, read_step)
        if backward_module and len(instance):
            first = np.full(2 * n, np.iinfo(np.intp).max, dtype=np.intp)
            np.minimum.at(first, instance, read_step)
            first_bw = np.where(first == np.iinfo(np.intp).max, -1, first)
        # what each step allocates: its node, then the outputs a multi-output op allocates with it
        made, made_at = _with_outputs(a, nodes, ran_at, in_fw if not backward_module else None, rec)
        if backward_module:
            copy = rec[made] | (v.role[made] == BACKWARD_ROLE)
            made_instance = np.where(copy, made + n, v.instances[made])
            keep = v.allocates[made] & (made_instance >= 0)
        else:  # a value computed inside a later kernel allocates nothing
            made_instance = made
            keep = v.allocates[made] & (np.frombuffer(inside, dtype=np.uint8)[made] == 0)
        made_instance, made_at = made_instance[keep], made_at[keep]
        made_instance, made_at = _first_each(made_instance, made_at, alloc)
        alloc[made_instance] = made_at
        unread = last[made_instance] < 0
        last[made_instance[unread]] = made_at[unread]
        allocated.extend(made_instance.tolist())
        if not backward_module:
            last_fw = last.copy()
        start = len(order)
    return Steps(alloc.tolist(), last_fw.tolist(), last.tolist(), first_bw.tolist(), allocated)


def _reads(a, order: list[int], inside: bytearray, memo: dict, fuses: bool, start: int):
    """The steps of `order` whose node runs there (not computed inside a later kernel, `inside`) and what each
    reads: (their nodes, their steps — `start` plus the place in `order` —, the nodes read one after the other, the
    step of each read). A node reading values computed inside it reads what they read (fusion.expand)."""
    at = np.asarray(order, dtype=np.intp)
    running = np.flatnonzero(np.frombuffer(inside, dtype=np.uint8)[at] == 0)
    nodes = at[running]
    ran_at = running + start
    if fuses:
        read, reader = fusion.expand_flat(a, nodes, inside, memo)
    else:
        read, lengths = a.flat_inputs(nodes)
        reader = np.repeat(np.arange(len(nodes)), lengths)
    return nodes, ran_at, read, ran_at[reader]


def _with_outputs(a, nodes: np.ndarray, ran_at: np.ndarray, in_fw: bytearray | None, recomputed: np.ndarray):
    """What each step allocates for, in step order: its node, then its getitems the module takes (forward, where
    `in_fw` is given: those the forward computes; backward: the recomputed ones and backward values) — (nodes,
    their steps; `ran_at`: the step of each of `nodes`)."""
    items, counts = a.flat_getitems(nodes)
    if not len(items):
        return nodes, ran_at
    taken = (
        np.frombuffer(in_fw, dtype=np.uint8)[items].astype(bool)
        if in_fw is not None
        else recomputed[items] | (a.vectors.role[items] == BACKWARD_ROLE)
    )
    # each getitem's place among its op's: 1, 2, ...
    rank = np.arange(1, len(items) + 1) - np.repeat(np.cumsum(counts) - counts, counts)
    item_at = np.repeat(ran_at, counts)
    made = np.concatenate([nodes, items[taken]])
    made_at = np.concatenate([ran_at, item_at[taken]])
    ranks = np.concatenate([np.zeros(len(nodes), dtype=np.intp), rank[taken]])
    order = np.lexsort((ranks, made_at))
    return made[order], made_at[order]


def _first_each(made: np.ndarray, made_at: np.ndarray, alloc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each instance of `made` not allocated yet (`alloc`), at its first place there (in step order), and its
    step."""
    fresh = alloc[made] < 0
    made, made_at = made[fresh], made_at[fresh]
    _, first = np.unique(made, return_index=True)
    first.sort()
    return made[first], made_at[first]
