"""The simulation's model of inductor, the default inner compiler: which buffers it writes out, and for how long.

inductor does not run the forward and backward modules node by node. The simulation follows seven of its habits when
`inner="inductor"`:

- ``add(mm(a, b), c)`` becomes one ``addmm(c, a, b)`` that runs where the add runs, so ``a`` and ``b`` stay live
  until then (a tied embedding's weight gradient keeps the logits' gradient until the end of backward);
- a buffer a module allocated and no longer reads is kept for the module's next allocation of the same dtype and
  size that inductor allocates (not a fallback op's output), so it stays live until then (pool.py);
- recomputation runs where the schedule puts it: remat numbers each run of recomputed nodes in the backward module
  (rewrite/split.mark_blocks) and, while inductor lowers it, refuses horizontal fusion across runs
  (_torch.fusion_barrier). On a torch without that hook inductor fuses a recomputed loop computed from saved values
  alone with the first backward kernel that reads one of them, and one that reads a buffer an earlier loop of its
  size reads (a parameter such as a rotary table, a constant, a saved value) with that loop, the recomputation it
  waits for pulled ahead with it; the simulation then allocates its buffer there (Problem.hoists, simulate._hoist);
- a forward value, a recomputed value or a backward gradient, computed by a pointwise op and read only by pointwise
  or reduction loops is computed inside those loops and never written out; what it reads stays live until they run.
  It is written out after all when several kernels read it and it reads more than four buffers or (on CPU) computes
  exp, log, sigmoid or tanh — unless its readers are loops of its size none of which depends on another: inductor
  then fuses them with it into one kernel, which keeps it local (a recomputed SiLU that the up-projection's product
  and the gradient's product both read) — and whenever it reads more than twelve buffers on CPU (eight elsewhere);
- a forward value the joint graph traces in its backward part (a gradient formula's factor the partition saves) is
  computed with the loops that produce its inputs, not after the whole forward (schedule.forward_ids);
- a module's kernels run in inductor's least-peak-first order when its estimate finds that lower (reorder.py), and
  a loop writes its output over a buffer of its size it reads for the last time, unless a loop it does not
  depend on reads that buffer too (inplace.py).

Pure functions of the graph facts and the plan; forward and backward (with its recomputation) are separate modules,
as each is its own inductor graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from ..capture import Graph

READS_LIMIT = 4  # torch._inductor.config.realize_reads_threshold
# torch._inductor.config.realize_cpu_acc_reads_threshold / _realize_acc_reads_threshold_default
ACC_READS_LIMIT = {"cpu": 12}
ACC_READS_DEFAULT = 8
# On CPU inductor writes out a loop read by several kernels when it computes one of these (ir.should_realize_on_reuse).
HEAVY_CPU = frozenset(
    {
        "aten.exp.default",
        "aten.log.default",
        "aten.log10.default",
        "aten.log1p.default",
        "aten.log2.default",
        "aten.sigmoid.default",
        "aten.tanh.default",
    }
)

OPAQUE, POINTWISE, REDUCTION = 0, 1, 2
# Ops inductor generates inside the kernels that read them though no tag marks them pointwise: value creators, and
# gathers (a load at computed indices).
_GENERATORS = frozenset(
    {
        "aten.full.default",
        "aten.scalar_tensor.default",
        "prims.iota.default",
        "aten.full_like.default",
        "aten.zeros_like.default",
        "aten.ones_like.default",
        "aten.embedding.default",
        "aten.index.Tensor",
        "aten.gather.default",
    }
)
_MM, _ADD = "aten.mm.default", "aten.add.Tensor"


def kind(v) -> int:
    """How inductor treats the op: POINTWISE (a loop over its inputs, which inductor may fuse with other loops),
    REDUCTION (the same, reducing) or OPAQUE (a library call: matmul, random op, fallback)."""
    if "nondeterministic_seeded" in v.tags:
        return OPAQUE
    if "pointwise" in v.tags or v.op in _GENERATORS:
        return POINTWISE
    return REDUCTION if "reduction" in v.tags else OPAQUE


def addmm_target(graph: Graph, v) -> str:
    """The add an mm becomes an addmm with (inductor's post-grad pattern), or "": the mm's only reader is an add of
    a tensor of the same dtype whose shape broadcasts to the mm's."""
    if v.op != _MM or len(v.users) != 1:
        return ""
    add = graph[v.users[0]]
    if add.op != _ADD or len(add.inputs) != 2:
        return ""
    other = graph[add.inputs[0] if add.inputs[1] == v.name else add.inputs[1]]
    if not other.is_tensor or other.dtype != v.dtype or not _broadcasts(other.shape, v.shape):
        return ""
    return add.name


def _broadcasts(shape: Sequence, to: Sequence) -> bool:
    if len(shape) > len(to):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(tuple(shape)), reversed(tuple(to))))


def folded(a, order: Sequence[int], member: bytearray, kept: bytearray) -> bytearray:
    """Per joint-graph position, 1 for an mm that one module (the nodes of `order`, in schedule order; `member` marks
    them) computes as an addmm where its add runs. `kept`: values the module must write out (saved for backward,
    outputs). `a`: the plan's Arrays."""
    out = bytearray(len(a.names))
    for i in select(order, a.folding_mask):
        target = a.folds[i]
        if member[target] and not kept[i] and _readers(a, i, member) == [target]:
            out[i] = 1
    return out


def select(order: Sequence[int], mask: bytes | bytearray) -> list[int]:
    """The nodes of `order` that `mask` (a byte per position, Arrays' masks) marks with 1, in order: one whole-array
    test rather than one per node."""
    nodes = np.asarray(order, dtype=np.intp)
    return nodes[np.frombuffer(mask, dtype=np.uint8)[nodes].astype(bool)].tolist()


def inlined(
    a,
    order: Sequence[int],
    member: bytearray,
    kept: bytearray,
    eligible: bytearray,
    folded_mm: bytearray,
    groups: list[tuple[int, ...]] | None = None,
) -> bytearray:
    """Per position, 1 for a value of `eligible` that inductor computes inside the kernels reading it: a pointwise
    value every reader of which (in the module) is a pointwise or reduction loop, and not one an addmm reads; still
    written out when several kernels read it and computing it in each would read more than READS_LIMIT buffers —
    unless its readers are loops inductor fuses with it into one kernel (`one_kernel`), which then keeps it local to
    that kernel; each such set of kernels is appended to `groups`, to run as one (reorder.together). Whether a
    reader is a kernel or computed inside others is known once every value is decided: a value whose readers end up
    in several kernels after all is written out, and the values after it decided again.
    `folded_mm`: the module's mms that run inside an addmm (`folded`); they stay marked in the result."""
    written: set[int] = set()  # values whose readers run in kernels of their own after all
    steps = (select(order, a.folding_mask), select(order, a.loop_mask))
    while True:
        out, fused = _inline_pass(a, steps, member, kept, eligible, folded_mm, None if groups is None else written)
        found, undone = [], set()
        for i, consumers in fused:
            kernels = _kernels_of(a, consumers, out, member)
            if kernels is None:
                undone.add(i)
            elif len(kernels) > 1:
                found.append(kernels)
        if not undone:
            if groups is not None:
                groups.extend(found)
            return out
        written |= undone


def _inside_reads(a, out: bytearray, reads: dict[int, frozenset[int]], owner: int) -> frozenset[int]:
    """The buffers a value computed inside its readers (`out[owner]`) reads, through those computed inside too;
    `reads` remembers them per value."""
    found = reads.get(owner)
    if found is None:
        acc: set[int] = set()
        for j in a.inputs[owner]:
            o = a.storage[j]
            if out[o]:
                acc |= _inside_reads(a, out, reads, o)
            else:
                acc.add(o)
        found = reads[owner] = frozenset(acc)
    return found


def _inline_pass(a, steps: tuple[list[int], list[int]], member, kept, eligible, folded_mm, written: set[int] | None):
    """One pass of `inlined` over the module's (mms inductor may fold, pointwise loops that allocate), each in
    schedule order: (its result, the values the one-kernel rule kept local with their readers). The rule applies to
    no value of `written`, and to none at all when `written` is None."""
    kinds = a.kinds
    folding, loops = steps
    absorbing = bytearray(len(a.names))  # adds that run as an addmm (a library call reading its other input)
    for i in folding:
        if folded_mm[i]:
            absorbing[a.folds[i]] = 1
    out = bytearray(folded_mm)
    reads: dict[int, frozenset[int]] = {}
    fused: list[tuple[int, list[int]]] = []

    heavy = bytearray(a.heavy) if a.heavy else bytearray(len(a.names))  # computes a heavy op, itself or inlined
    storage, inputs = a.storage, a.inputs
    for i in loops:
        if not eligible[i] or kept[i] or absorbing[i]:
            continue
        consumers = _readers(a, i, member)
        if not consumers or not all(kinds[c] != OPAQUE and not absorbing[c] for c in consumers):
            continue
        out[i] = 1
        for j in inputs[i]:
            if out[storage[j]] and heavy[storage[j]]:
                heavy[i] = 1
                break
        read = len(_inside_reads(a, out, reads, storage[i])) if out[storage[i]] else 1
        shared = len(consumers) > 1 and (read > READS_LIMIT or heavy[i])
        if shared and written is not None and i not in written and one_kernel(a, i, consumers, member):
            shared = False
            fused.append((i, consumers))
        if shared or read > a.acc_reads[i]:
            out[i] = 0
            reads.pop(i, None)
    return out, [(i, consumers) for i, consumers in fused if out[i]]


def one_kernel(a, i: int, consumers: list[int], member: bytearray) -> bool:
    """Whether inductor fuses value `i` and the loops reading it into one kernel, so that `i` is never written out
    though several loops read it (its buffer is local to the kernel): they are pointwise loops over as many elements
    as `i`, and none of them depends on another within the module (fusing them would make a cycle)."""
    kinds, numel = a.kinds, a.numel
    if any(kinds[c] != POINTWISE or numel[c] != numel[i] for c in consumers):
        return False
    return not _reaches(a, consumers, member)


def _reaches(a, nodes: Sequence[int], member: bytearray) -> bool:
    """Whether one of `nodes` reads another within the module, directly or through other nodes (a search forward
    from each, no further than the highest of them: positions are in graph order, so a reader follows what it
    reads)."""
    targets, highest = set(nodes), max(nodes)
    for start in nodes:
        seen, stack = {start}, [start]
        while stack:
            for u in a.users[stack.pop()]:
                if u in targets:
                    return True
                if member[u] and u < highest and u not in seen:
                    seen.add(u)
                    stack.append(u)
    return False


def _kernels_of(a, consumers: list[int], out: bytearray, member: bytearray) -> tuple[int, ...] | None:
    """The kernels computing `consumers` (a consumer computed inside its one reader is computed in that reader's
    kernel), in graph order; None when one is computed inside several kernels or the kernels read one another."""
    kernels: dict[int, None] = {}
    for c in consumers:
        while out[c]:
            readers = _readers(a, c, member)
            if len(readers) != 1:
                return None
            c = readers[0]
        kernels[c] = None
    found = tuple(sorted(kernels))
    return None if len(found) > 1 and _reaches(a, found, member) else found


def read_by_a_loop(a, i: int, member: bytearray) -> bool:
    """Whether a loop computes `i` and a loop among the module's nodes `member` reads it, itself or through views:
    inductor fuses such a reader with the loop computing `i`. With contiguous=True, the forward's readers of such a
    packed value read the value itself rather than its arena copy, so that fusion survives (Problem.reads_unpacked);
    a library call reading the copy loses none."""
    kinds = a.kinds
    return kinds[i] != OPAQUE and any(kinds[u] != OPAQUE for u in _readers(a, i, member))


def _readers(a, i: int, member: bytearray) -> list[int]:
    """The module's nodes that read `i` itself or through views of it."""
    if not a.view_users[i]:
        return [u for u in a.users[i] if member[u]]
    found, stack = [], [i]
    while stack:
        for u in a.users[stack.pop()]:
            if not member[u]:
                continue
            if a.is_view[u]:
                stack.append(u)
            else:
                found.append(u)
    return found


def expand(a, i: int, inlined: bytearray, memo: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """What node `i` reads once the values computed inside it (`inlined`) are replaced by what they read."""
    known = memo.get(i)
    if known is not None:
        return known
    storage = a.storage
    inputs = a.distinct[i]
    for position in range(len(inputs)):
        if inlined[storage[inputs[position]]]:
            break
    else:  # nothing computed inside it: what it reads is its inputs
        memo[i] = inputs
        return inputs
    found = list(inputs[:position])
    for j in inputs[position:]:
        owner = storage[j]
        if inlined[owner]:
            found.extend(expand(a, owner, inlined, memo))
        else:
            found.append(j)
    memo[i] = result = tuple(dict.fromkeys(found))
    return result


def expand_flat(a, nodes: np.ndarray, inlined: bytearray, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """`expand` of each of `nodes`, flattened: (the nodes read, the place in `nodes` of the node reading each). The
    nodes that read no value computed inside them (most) read their inputs, found in whole-array steps; the others'
    reads follow, each node's in `expand`'s order."""
    read, lengths = a.flat_inputs(nodes)
    reader = np.repeat(np.arange(len(nodes)), lengths)
    expanding = np.zeros(len(nodes), dtype=bool)
    expanding[reader[np.frombuffer(inlined, dtype=np.uint8)[a.vectors.storage[read]].astype(bool)]] = True
    if not expanding.any():
        return read, reader
    plain = ~expanding[reader]
    places = np.flatnonzero(expanding)
    expanded = [memo.get(i) or expand(a, i, inlined, memo) for i in nodes[places].tolist()]
    counts = np.fromiter(map(len, expanded), dtype=np.intp, count=len(expanded))
    more = np.fromiter(itertools.chain.from_iterable(expanded), dtype=np.intp, count=int(counts.sum()))
    return np.concatenate([read[plain], more]), np.concatenate([reader[plain], np.repeat(places, counts)])


def segments(a, bw: list[int], recomputed, hoists: bool) -> list[int]:
    """The backward segment of each node, as rewrite/split.mark_blocks numbers them in the backward module (a run of
    recomputed nodes starts one; forward nodes: 0). inductor's fusion keeps segments apart (_torch.fusion_barrier);
    without the barrier (`hoists`) it fuses across them, so every node is in segment 0."""
    segment = [0] * len(a.names)
    if hoists:
        return segment
    current, previous = 0, False
    for i in bw:
        here = bool(recomputed[i])
        current += here and not previous
        segment[i] = current
        previous = here
    return segment
