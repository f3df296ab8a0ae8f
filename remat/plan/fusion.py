"""The simulation's model of inductor, the default inner compiler: which buffers it writes out, and for how long.

inductor does not run the forward and backward modules node by node. The simulation follows seven of its habits when
`inner="inductor"`:

- ``add(mm(a, b), c)`` becomes one ``addmm(c, a, b)`` that runs where the add runs, so ``a`` and ``b`` stay live
  until then (a tied embedding's weight gradient keeps the logits' gradient until the end of backward);
- a buffer a module allocated and no longer reads is kept for the module's next allocation of the same dtype and
  size, so it stays live until then, unless holding it would raise inductor's estimate of the module's peak
  (reuse.py);
- recomputation runs where the schedule puts it: remat numbers each run of recomputed nodes in the backward module
  (rewrite/split.mark_blocks) and, while inductor lowers it, refuses horizontal fusion across runs
  (_torch.fusion_barrier). On a torch without that hook inductor fuses a recomputed loop computed from saved values
  alone with the first backward kernel that reads one of them, and one that reads a buffer an earlier loop of its
  size reads (a parameter such as a rotary table, a constant, a saved value) with that loop, the recomputation it
  waits for pulled ahead with it; the simulation then allocates its buffer there (Problem.hoists, simulate._hoist);
- a forward value, a recomputed value or a backward gradient, computed by a pointwise op and read only by pointwise
  or reduction loops is computed inside those loops and never written out; what it reads stays live until they run.
  It is written out after all when several kernels read it and it reads more than four buffers or (on CPU) computes
  exp, log, sigmoid or tanh, and whenever it reads more than twelve buffers on CPU (eight elsewhere). Readers that
  inductor fuses with it into one kernel (pointwise loops of its size, none waiting for another) are one kernel:
  the buffer is dropped, and the kernel runs where the first of them was, after what any of them waits for (grouped);
- a forward value the joint graph traces in its backward part (a gradient formula's factor the partition saves) is
  computed with the loops that produce its inputs, not after the whole forward (schedule.forward_ids);
- a module's kernels run in inductor's least-peak-first order when its estimate finds that lower (reorder.py), and
  a loop writes its output over a buffer of its size it reads for the last time, unless a loop it does not
  depend on reads that buffer too (reuse.in_place).

Pure functions of the graph facts and the plan; forward and backward (with its recomputation) are separate modules,
as each is its own inductor graph.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    for i in order:
        target = a.folds[i]
        if target >= 0 and member[target] and not kept[i] and _readers(a, i, member) == [target]:
            out[i] = 1
    return out


def inlined(
    a,
    order: Sequence[int],
    member: bytearray,
    kept: bytearray,
    eligible: bytearray,
    folded_mm: bytearray,
    kernels: list[tuple[int, ...]] | None = None,
) -> bytearray:
    """Per position, 1 for a value of `eligible` that inductor computes inside the kernels reading it: a pointwise
    value every reader of which (in the module) is a pointwise or reduction loop, and not one an addmm reads; still
    written out when several kernels read it and computing it in each would read more than READS_LIMIT buffers.
    `folded_mm`: the module's mms that run inside an addmm (`folded`); they stay marked in the result.

    `kernels`: given where the module's kernels run in schedule order (the fusion barrier holds), readers that
    become one kernel with the value (`_one_kernel`) count once — inductor writes the value out, then drops the
    buffer, as only that kernel reads it — and each such set of readers is appended to it (`grouped` orders the
    module by them)."""
    kinds, allocates = a.kinds, a.allocates
    absorbing = bytearray(len(a.names))  # adds that run as an addmm (a library call reading its other input)
    for i in order:
        if folded_mm[i]:
            absorbing[a.folds[i]] = 1
    out = bytearray(folded_mm)
    reads: dict[int, frozenset[int]] = {}

    def buffers(i: int) -> frozenset[int]:
        owner = a.storage[i]
        if not out[owner]:
            return frozenset((owner,))
        if owner not in reads:
            reads[owner] = frozenset().union(*(buffers(j) for j in a.inputs[owner]))
        return reads[owner]

    heavy = bytearray(a.heavy) if a.heavy else bytearray(len(a.names))  # computes a heavy op, itself or inlined
    for i in order:
        if not eligible[i] or kinds[i] != POINTWISE or not allocates[i] or kept[i] or absorbing[i]:
            continue
        consumers = _readers(a, i, member)
        if not consumers or any(kinds[c] == OPAQUE or absorbing[c] for c in consumers):
            continue
        out[i] = 1
        if any(out[a.storage[j]] and heavy[a.storage[j]] for j in a.inputs[i]):
            heavy[i] = 1
        read = len(buffers(i))
        shared = len(consumers) > 1 and (read > READS_LIMIT or heavy[i])
        if shared and kernels is not None and _one_kernel(a, i, consumers, member):
            shared = False
            kernels.append(tuple(consumers))
        if shared or read > a.acc_reads[i]:
            out[i] = 0
            reads.pop(i, None)
    return out


def _one_kernel(a, i: int, consumers: list[int], member: bytearray) -> bool:
    """Whether inductor fuses pointwise value `i` and the loops `consumers` that read it into one kernel: pointwise
    loops of its iteration size, none computed from another. Each is then a consumer fused with its producer
    (vertical fusion, which the fusion barrier between backward segments leaves alone). A reduction among them, or
    one that waits for another in the module (`member`), leaves them in kernels of their own."""
    if any(a.kinds[c] != POINTWISE or a.numel[c] != a.numel[i] for c in consumers):
        return False
    return not _any_ancestor(a, consumers, member)


def _any_ancestor(a, nodes: list[int], member: bytearray) -> bool:
    """Whether some node of `nodes` is an ancestor of another within the module (`member`; a search back from each,
    no deeper than the lowest of them: positions are in graph order, so an ancestor precedes what reads it)."""
    lowest = min(nodes)
    targets = set(nodes)
    for start in nodes:
        seen, stack = {start}, [start]
        while stack:
            for v in a.distinct[stack.pop()]:
                if v in targets and v != start:
                    return True
                if v > lowest and member[v] and v not in seen:
                    seen.add(v)
                    stack.append(v)
    return False


def grouped(a, order: Sequence[int], kernels: list[tuple[int, ...]] | None) -> list[int]:
    """The module's schedule `order` once the loops of each set in `kernels` run as one kernel: inductor puts a fused
    kernel where the first of its loops was and runs ahead of it what any of them waits for
    (Scheduler.topological_sort_schedule over the fused nodes sorted by min_order). Sets that share a loop are one
    kernel. `order` itself when there is nothing to fuse or the fused kernels would wait for each other."""
    if not kernels:
        return list(order)
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.get(i, i) != i:
            i = parent[i]
        return i

    for loops in kernels:
        first = find(loops[0])
        for i in loops[1:]:
            root = find(i)
            if root != first:
                parent[root] = first
    position = {i: p for p, i in enumerate(order)}
    loops_of: dict[int, list[int]] = {}
    for i in order:
        loops_of.setdefault(find(i), []).append(i)
    distinct = a.distinct
    out: list[int] = []
    seen: set[int] = set()
    for i in order:
        unit = find(i)
        if unit in seen:
            continue
        seen.add(unit)
        stack = [(unit, iter([j for m in loops_of[unit] for j in distinct[m]]))]
        while stack:
            unit, pending = stack[-1]
            for j in pending:
                if j in position and find(j) not in seen:
                    found = find(j)
                    seen.add(found)
                    stack.append((found, iter([k for m in loops_of[found] for k in distinct[m]])))
                    break
            else:
                stack.pop()
                out.extend(loops_of[unit])
    at = {i: p for p, i in enumerate(out)}
    if any(j in at and at[j] > at[i] for i in out for j in distinct[i]):
        return list(order)
    return out


def _readers(a, i: int, member: bytearray) -> list[int]:
    """The module's nodes that read `i` itself or through views of it."""
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
    if i in memo:
        return memo[i]
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
