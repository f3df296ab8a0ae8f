"""(joint graph, plan) → memory timeline of the forward+backward schedule.

What is counted is docs/design.md's activation memory: every storage the step allocates — forward activations,
saved values, recomputed values, backward temporaries — while parameters, inputs, tangents and the gradients the
step returns are left out. A storage is live from the node that allocates it to the last node that reads it or any
view of it; saved storages live on into backward until their last backward reader; forward outputs stay alive to the
end of the step (the caller holds them). Views allocate nothing.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping

import numpy as np

from . import arena, fusion, inplace, instances, pool, reorder
from .arrays import BACKWARD as BACKWARD_ROLE
from .problem import Problem, Resolved
from .schedule import backward_ids, forward_ids
from .transfer import kept_bytes

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
    # storages allocated in backward (recomputed values, gradients, temporaries) and live at the peak step, by owner
    # position; empty when the peak is in forward
    backward_at_peak: frozenset[int] = dataclasses.field(default=frozenset(), repr=False)

    @property
    def steps(self) -> tuple[str, ...]:
        """Node names per step."""
        return tuple(self.names[i] for i in self.step_ids)

    @property
    def kinds(self) -> tuple[str, ...]:
        """ "forward" | "recompute" | "backward" per step."""
        return tuple(
            FORWARD if p < self.num_forward else RECOMPUTE if name in self.recomputed else BACKWARD
            for p, name in enumerate(self.steps)
        )

    def live_at_peak(self) -> list[str]:
        """Saved values whose storage is live at the peak step, in schedule order."""
        return [n for n, (a, b) in self.saved_spans.items() if a <= self.peak_step <= b]


@dataclasses.dataclass(frozen=True)
class Lifetimes:
    """When each counted storage of a plan is live: the schedule and, per storage instance, its steps."""

    fw: list[int]  # forward schedule (joint-graph positions)
    bw: list[int]  # backward schedule, recomputation included
    spans: list[tuple[int, int, int]]  # (owner position, first step, last step) per counted storage instance
    saved_spans: dict[str, tuple[int, int]]
    # Saved bytes that are no graph value: generator states kept to replay random ops (from the op's forward run to
    # its replay) and the kept forms of values that leave the device (from the value's forward step to its first
    # backward read; runtime/table.py's Move.kept): (bytes, first, last step).
    extra_spans: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    # contiguous=True: the arena slot of each packed saved value, (owner position, slot bytes), live for the whole
    # step: the pool holds the arena from step to step (runtime/buffers.py).
    arena: list[tuple[int, int]] = dataclasses.field(default_factory=list)


def lifetimes(problem: Problem, resolved: Resolved) -> Lifetimes:
    """Live intervals of every storage the step allocates under a plan. Parameters, inputs, tangents and the
    gradients the step returns are left out."""
    a = problem.arrays
    n = len(a.names)
    fw = forward_ids(problem, resolved)
    bw = backward_ids(problem, resolved)
    storage = a.storage
    recomputed = bytearray(n)
    for name in resolved.recomputed:
        recomputed[a.index[name]] = 1
    excluded = problem.excluded_storages

    # A storage instance is its owner's index (the forward copy) or owner + n (a copy made in backward).
    num_fw = len(fw)
    in_fw = bytearray(n)
    for i in fw:
        in_fw[i] = 1
    memo_fw: dict[int, tuple[int, ...]] = {}
    memo_bw: dict[int, tuple[int, ...]] = {}
    fuses = problem.fuses
    if fuses:
        segment = fusion.segments(a, bw, recomputed, problem.hoists)  # in the module's order, before reordering
        fw_in, bw_in, fw_kept, fw_groups, bw_groups = _fused(problem, resolved, in_fw, bw, excluded, recomputed)
        fw = reorder.peak_order(a, fw, fw_in, fw_kept, memo_fw, fw_groups)
        bw_out = bytearray(n)
        for i in excluded:
            bw_out[i] = 1
        bw = reorder.peak_order(a, bw, bw_in, bw_out, memo_bw, bw_groups)
    else:
        fw_in, bw_in = bytearray(n), bytearray(n)
    alloc, last_fw, last, first_bw, allocated = instances.steps(
        a, (fw, fw_in, memo_fw), (bw, bw_in, memo_bw), in_fw, recomputed, fuses
    )
    if problem.hoists:
        _hoist(problem, bw, num_fw, recomputed, bw_in, memo_bw, alloc, first_bw)
    end = num_fw + len(bw) - 1
    for out in problem.graph.fw_outputs:
        k = a.instances[a.index[out]]
        if k >= 0:
            last[k] = end
    saved = sorted({storage[a.index[s]] for s in resolved.saved})  # a saved view keeps its base's storage
    saved_spans = {a.names[i]: (alloc[i], last[i]) for i in saved if alloc[i] >= 0 and i not in excluded}
    written_over: dict[int, int] = {}  # in-place writes: the instance taken -> the instance written into it
    if problem.fuses:
        written_over = inplace.in_place(
            problem, resolved, (fw, fw_in, memo_fw), (bw, bw_in, memo_bw), recomputed, alloc, last, segment
        )
    spans = [(k % n, alloc[k], last[k]) for k in allocated if k % n not in excluded]
    unused, scratch = _unused_outputs(problem, fw, in_fw, bw, recomputed)
    spans += unused
    scratch_from = len(spans)
    spans += scratch
    slots: list[tuple[int, int]] = []
    unpacked = spans
    if problem.transfer.contiguous:
        spans, slots = arena.pack(
            problem, resolved, spans, saved_spans, end, arena.first_written(written_over, alloc, n), last_fw
        )
    if problem.fuses:
        # a kernel runs at a step unless its node is a view or computed inside another kernel
        kernels = _kernel_counts(a, fw, fw_in, bw, bw_in)
        spans = pool.reuse(spans, a.reuse_keys, a.nbytes, num_fw, problem.takes_freed, scratch_from, kernels, unpacked)
    extra = _rng_spans(problem, resolved, fw, bw)
    if resolved.offloaded or resolved.sharded:
        spans, extra = _split_transfers(problem, resolved, spans, extra, last_fw, first_bw, saved_spans)
    return Lifetimes(fw, bw, spans, saved_spans, extra, slots)


def _kernel_counts(a, fw: list[int], fw_in: bytearray, bw: list[int], bw_in: bytearray) -> list[int]:
    """Per step (forward, then backward), how many steps up to it run a kernel: a node that is no view and not
    computed inside another kernel of its module (`fw_in`, `bw_in`)."""
    view = np.frombuffer(a.view_mask, dtype=np.uint8)
    runs = [
        (view[nodes] | np.frombuffer(inside, dtype=np.uint8)[nodes]) == 0
        for nodes, inside in ((np.asarray(fw, dtype=np.intp), fw_in), (np.asarray(bw, dtype=np.intp), bw_in))
    ]
    return np.cumsum(np.concatenate(runs)).tolist()


def _hoist(problem: Problem, bw: list[int], num_fw: int, recomputed, bw_in, memo, alloc, first_bw) -> None:
    """Without the fusion barrier (Problem.hoists), inductor fuses loops that read the same buffers, and nothing
    orders recomputation after the backward work before it (fusion.py), so a recomputed loop's buffer is allocated
    earlier than the schedule puts it:
    - computed from saved values alone, it runs with the first kernel of the backward module that reads one of them;
    - it runs with the first loop of its iteration size that reads a buffer it reads too (a parameter, a constant, a
      saved or recomputed value), the recomputation it waits for (the matmuls it reads) pulled ahead with it — a
      layer's recomputed rotary embedding runs with the next layer's, which reads the same tables.
    inductor declines some of these fusions (loops too many kernels apart, or sharing too few bytes); the simulation
    takes every one, and reads stay where the schedule puts them: a bound."""
    if not any(recomputed):
        return
    a = problem.arrays
    n = len(a.names)
    kinds, numel, storage = a.kinds, a.numel, a.storage
    first_read: dict[tuple[int, int], int] = {}  # (buffer, iteration size) -> first loop position reading it
    for pos, i in enumerate(bw, start=num_fw):
        if bw_in[i] or kinds[i] == fusion.OPAQUE:
            continue
        for j in fusion.expand(a, i, bw_in, memo):
            o = storage[j]
            first_read.setdefault((o + n if recomputed[o] else o, numel[i]), pos)
    for i in bw:
        k = i + n
        if not recomputed[i] or bw_in[i] or alloc[k] < 0 or kinds[i] == fusion.OPAQUE:
            continue
        reads = fusion.expand(a, i, bw_in, memo)
        earliest = alloc[k]
        for j in reads:
            if recomputed[storage[j]]:
                break  # waits for another recomputed buffer
            read = a.instances[j]
            if read >= 0 and 0 <= first_bw[read] < earliest:
                earliest = first_bw[read]
        for j in reads:
            o = storage[j]
            earliest = min(earliest, first_read.get((o + n if recomputed[o] else o, numel[i]), earliest))
        if earliest < alloc[k]:
            _pull(a, i, earliest, recomputed, bw_in, memo, alloc)


def _pull(a, i: int, at: int, recomputed, bw_in, memo, alloc) -> None:
    """Move the allocation of recomputed buffer `i`, and of the recomputed buffers it reads, to step `at` at latest."""
    n = len(a.names)
    stack = [i]
    while stack:
        o = stack.pop()
        if alloc[o + n] > at:
            alloc[o + n] = at
            stack.extend(a.storage[j] for j in fusion.expand(a, o, bw_in, memo) if recomputed[a.storage[j]])


def _fused(problem: Problem, resolved: Resolved, in_fw: bytearray, bw: list[int], excluded: frozenset[int], recomputed):
    """Per position, whether inductor computes the value inside a later kernel rather than writing it out, in the
    forward module (an mm inside an addmm, and values read only by pointwise loops) and in the backward module (an
    addmm's mm, and gradients and recomputed values read only by pointwise loops) — fusion.py. The forward writes out
    what it saves and returns; the backward its gradients. The recomputed loops that are written out run ahead with
    the kernels they fuse with (_hoist). Then each module's groups of kernels inductor fuses into one
    (fusion.inlined's `groups`)."""
    a = problem.arrays
    n = len(a.names)
    fw = [i for i in range(n) if in_fw[i]]
    in_bw, fw_kept, bw_kept, gradients = bytearray(n), bytearray(n), bytearray(n), bytearray(n)
    for i in bw:
        in_bw[i] = 1
        # computed from gradients, so never ahead of them; or part of a gradient formula left to backward
        gradients[i] = a.role[i] == BACKWARD_ROLE or a.formula[i] or recomputed[i]
    for name in (*resolved.saved, *problem.graph.fw_outputs):
        fw_kept[a.storage[a.index[name]]] = 1
    for i in excluded:
        bw_kept[i] = 1
    bw_folded = fusion.folded(a, bw, in_bw, bw_kept)
    fw_folded = fusion.folded(a, fw, in_fw, fw_kept)
    # Without the fusion barrier inductor fuses across segments as well (_hoist's model); the one-kernel rule is the
    # barrier's: inductor then fuses the loops reading a value where the schedule puts them.
    fw_groups: list[tuple[int, ...]] | None = None if problem.hoists else []
    bw_groups: list[tuple[int, ...]] | None = None if problem.hoists else []
    return (
        fusion.inlined(a, fw, in_fw, fw_kept, in_fw, fw_folded, fw_groups),
        fusion.inlined(a, bw, in_bw, bw_kept, gradients, bw_folded, bw_groups),
        fw_kept,
        fw_groups or [],
        bw_groups or [],
    )


def _split_transfers(problem, resolved, spans, extra, last_fw, first_bw, saved_spans):
    """A value that leaves the device is live there until its last forward read, then again from its reload or
    gather (just before its first backward read) to its last; its kept form (a shard; on CPU, where the host is the
    device, a host copy) lives in between. Only the saved instance's span splits: a one-step scratch span sized like
    the value (dropout's) stays as it is."""
    a, graph = problem.arrays, problem.graph
    world = problem.transfer.world
    moves = resolved.moves
    leaving = {a.index[s] for s in moves}
    out = []
    for owner, first, final in spans:
        if owner not in leaving or first_bw[owner] < 0 or saved_spans.get(a.names[owner]) != (first, final):
            out.append((owner, first, final))
            continue
        out.append((owner, first, max(first, last_fw[owner])))
        out.append((owner, first_bw[owner], final))
        name = a.names[owner]
        kept = kept_bytes(graph[name], moves[name], world)
        if kept:
            extra.append((kept, first, first_bw[owner]))
    return out, extra


def _unused_outputs(problem: Problem, fw: list[int], in_fw, bw: list[int], recomputed) -> tuple[list, list]:
    """A multi-output op allocates all its outputs when it runs; those the schedule does not take (a recomputed
    dropout whose output backward does not read) live for that step only, as does an op's scratch: (owner, step,
    step) spans of the unused outputs, and of the scratch."""
    a = problem.arrays
    getitems, nbytes, workspace = a.getitems, a.nbytes, a.workspace
    spans: list[tuple[int, int, int]] = []
    scratch: list[tuple[int, int, int]] = []
    for pos in _allocating_more(a, fw):
        i = fw[pos]
        if getitems[i]:
            spans.extend((g, pos, pos) for g in getitems[i] if not in_fw[g] and nbytes[g])
        if workspace[i] >= 0:
            scratch.append((workspace[i], pos, pos))
    for pos in _allocating_more(a, bw):
        i = bw[pos]
        pos += len(fw)
        if recomputed[i] and getitems[i]:
            spans.extend((g, pos, pos) for g in getitems[i] if not recomputed[g] and nbytes[g])
        if workspace[i] >= 0 and (recomputed[i] or a.role[i] == BACKWARD_ROLE):
            scratch.append((workspace[i], pos, pos))
    return spans, scratch


def _allocating_more(a, order: list[int]) -> list[int]:
    """The steps of `order` whose node allocates more than its own value: a multi-output op (its outputs) or an op
    with scratch (Arrays.workspace)."""
    return np.flatnonzero(np.frombuffer(a.allocating_more, dtype=np.uint8)[np.asarray(order, dtype=np.intp)]).tolist()


def _rng_spans(problem: Problem, resolved: Resolved, fw: list[int], bw: list[int]) -> list[tuple[int, int, int]]:
    replay = problem.constraints.replay
    replayed = [name for name in resolved.recomputed if name in replay]
    if not replayed:
        return []
    index = problem.arrays.index
    fw_pos = {i: p for p, i in enumerate(fw)}
    bw_pos = {i: p for p, i in enumerate(bw, start=len(fw))}
    spans = []
    for name in sorted(replayed, key=index.__getitem__):
        i = index[name]
        if i in fw_pos and i in bw_pos:
            spans.append((replay[name], fw_pos[i], bw_pos[i]))
    return spans


def _columns(spans: list[tuple[int, int, int]]) -> tuple[tuple[int, ...], ...]:
    """The spans' three columns (each a tuple; empty ones where there are no spans)."""
    return tuple(zip(*spans)) or ((), (), ())


def simulate(problem: Problem, resolved: Resolved) -> Timeline:
    """The plan's memory timeline."""
    a = problem.arrays
    life = lifetimes(problem, resolved)
    steps = life.fw + life.bw
    nbytes = a.nbytes
    owners, firsts, finals = (np.array(column, dtype=np.intp) for column in _columns(life.spans))
    sizes, extra_firsts, extra_finals = (np.array(column, dtype=np.int64) for column in _columns(life.extra_spans))
    delta = np.zeros(len(steps) + 1, dtype=np.int64)
    for size, first, final in ((a.vectors.nbytes[owners], firsts, finals), (sizes, extra_firsts, extra_finals)):
        np.add.at(delta, first, size)
        np.subtract.at(delta, final + 1, size)
    delta[0] += sum(size for _, size in life.arena)  # the arena: held for the whole step
    running = np.cumsum(delta[:-1])
    live = tuple(running.tolist())
    peak_step = int(running.argmax()) if live else 0  # the first step at the peak
    peak = live[peak_step] if live else 0
    num_fw = len(life.fw)
    at_peak = (
        frozenset(owners[(firsts >= num_fw) & (firsts <= peak_step) & (finals >= peak_step)].tolist())
        if peak_step >= num_fw
        else frozenset()
    )
    leaving = resolved.sharded | resolved.offloaded  # their saved bytes are the extra spans' kept forms
    saved_bytes = sum(nbytes[a.index[s]] for s in life.saved_spans if s not in leaving) + sum(
        s[0] for s in life.extra_spans
    )
    return Timeline(
        tuple(steps),
        a.names,
        resolved.recomputed,
        live,
        peak,
        peak_step,
        saved_bytes,
        num_fw,
        types.MappingProxyType(life.saved_spans),
        at_peak,
    )
