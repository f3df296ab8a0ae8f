"""inductor's peak-memory reordering (torch._inductor.config.reorder_for_peak_memory), as the simulation models it.

After fusing, inductor may run a module's kernels in another topological order than the one it was handed: it
estimates the peak of the given order and of a greedy "least peak memory first" order (memory.topological_sort_lpmf)
and runs the lower. The greedy order runs first, among the kernels whose inputs exist, one that frees more than it
allocates — a weight gradient's matmul that reads a saved activation for the last time runs before the input
gradient's matmul, which reads none. inductor's estimate counts every buffer the module allocates (the gradients it
returns included) and the inputs it may free, a buffer from the kernel that writes it to the last kernel that reads
it; so does this model's, over the simulation's kernels (the values not computed inside another kernel, fusion.py).
inductor also tries a breadth-first and a depth-first order; the simulation does not, so its peak can only be above
what inductor reaches through them.

Pure functions of the graph arrays and one module's schedule.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Sequence

from . import arrays, fusion


def peak_order(
    a, order: Sequence[int], inside: bytearray, outputs: bytearray, memo: dict, groups: Sequence[tuple[int, ...]] = ()
) -> list[int]:
    """The order inductor runs the module's nodes in: `order`, or the greedy least-peak order when inductor's
    estimate finds that one lower. `inside`: values computed inside the kernels reading them (each runs just ahead of
    its first reader); `outputs`: storages the module returns (never freed); `memo`: fusion.expand's, for this
    module; `groups`: nodes inductor computes in one kernel (fusion.inlined), which run together (`together`), in
    the greedy order too."""
    order = together(a, order, groups)
    # views are no kernels of inductor's: like the values computed inside kernels, each runs ahead of its first reader
    through = arrays.either(inside, a.view_mask)
    nodes = _kernel_nodes([i for i in order if not through[i]], groups)
    if len(nodes) < 3:
        return list(order)
    kernels = _Kernels(a, nodes, inside, outputs, memo, order, through)
    given = kernels.estimate(range(len(nodes)))
    if given <= kernels.floor():
        return list(order)  # no order's estimate is lower: the given one stays, as in inductor
    greedy = kernels.least_peak_first(given)
    if greedy is None or kernels.estimate(greedy) >= given:
        return list(order)
    # each value computed inside a kernel runs just ahead of its first reader in the new order, after what it reads
    out: list[int] = []
    placed = bytearray(len(a.names))
    distinct = a.distinct
    member = bytearray(len(a.names))
    for i in order:
        member[i] = 1
    for k in greedy:
        for i in nodes[k]:
            stack = [(i, iter(distinct[i]))]
            while stack:
                node, pending = stack[-1]
                for j in pending:
                    if member[j] and through[j] and not placed[j]:
                        stack.append((j, iter(distinct[j])))
                        break
                else:
                    stack.pop()
                    placed[node] = 1
                    out.append(node)
    return out + [i for i in order if not placed[i]]


def together(a, order: Sequence[int], groups: Sequence[tuple[int, ...]]) -> list[int]:
    """`order` with each group of kernels inductor fuses into one (fusion.inlined) run together where the last of them
    runs, and what reads an earlier one (the kernels after it in `order` that depend on it) moved after them, in
    their order: inductor's fused kernel runs once all its inputs exist."""
    out = list(order)
    for group in groups:
        position = {i: p for p, i in enumerate(out)}
        if any(g not in position for g in group):
            continue
        first, final = min(position[g] for g in group), max(position[g] for g in group)
        members = set(group)
        waiting: set[int] = set()
        stay, fused, after = [], [], []
        for i in out[first : final + 1]:
            if i in members:
                fused.append(i)
                waiting.add(i)
            elif any(j in waiting for j in a.distinct[i]):
                after.append(i)
                waiting.add(i)
            else:
                stay.append(i)
        out[first:] = stay + fused + after + out[final + 1 :]
    return out


def _kernel_nodes(nodes: list[int], groups: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The module's kernels in order, each the nodes it computes: one node, or a group where its first node runs."""
    if not groups:
        return [(i,) for i in nodes]
    group_of = {i: group for group in groups for i in group}
    kernels: list[list[int]] = []
    started: dict[tuple[int, ...], list[int]] = {}
    for i in nodes:
        group = group_of.get(i)
        if group is None:
            kernels.append([i])
        elif group in started:
            started[group].append(i)
        else:
            started[group] = [i]
            kernels.append(started[group])
    return [tuple(kernel) for kernel in kernels]


class _Kernels:
    """One module's kernels (indices into `nodes`) with the buffers each reads and writes, as inductor's memory
    planning sees them (memory.py: MemoryPlanningInfoForNode / ForBuffer). What each kernel waits for (`preds`,
    `succs`) is found when first read: the estimate of the given order needs only the buffers."""

    def __init__(
        self,
        a,
        nodes: list[tuple[int, ...]],
        inside: bytearray,
        outputs: bytearray,
        memo: dict,
        order,
        through: bytearray,
    ) -> None:
        storage, nbytes, allocates, instances = a.storage, a.nbytes, a.allocates, a.instances
        n = len(a.names)
        position = [-1] * n  # per node: the kernel computing it
        for k, kernel in enumerate(nodes):
            for i in kernel:
                position[i] = k
        self._graph = (a, nodes, order, position, through)
        self._links: tuple[list[int], list[list[int]]] | None = None
        self.size = nbytes  # bytes per buffer (storage owner)
        self.reads: list[tuple[int, ...]] = []  # per kernel: the counted buffers it reads
        self.writes: list[tuple[int, ...]] = []  # per kernel: the buffers it allocates
        self.readers: dict[int, list[int]] = {}
        self.outputs = outputs
        readers = self.readers
        # per storage: 1 for a buffer of the module or an input it may free (a saved activation; never a parameter),
        # 0 for one it does not count, 2 until known
        counted = bytearray(b"\x02") * n
        expand, reads, writes = fusion.expand, self.reads, self.writes
        for k, kernel in enumerate(nodes):
            buffers: dict[int, None] = {}
            for i in kernel:
                expanded = memo.get(i)
                for j in expanded if expanded is not None else expand(a, i, inside, memo):
                    o = storage[j]
                    keep = counted[o]
                    if keep == 2:
                        keep = counted[o] = bool(nbytes[o]) and (position[o] >= 0 or instances[o] >= 0)
                    if keep:
                        buffers[o] = None
            reads.append(tuple(buffers))
            for o in buffers:
                if o in readers:
                    readers[o].append(k)
                else:
                    readers[o] = [k]
            if len(kernel) == 1:
                writes.append(kernel if allocates[kernel[0]] else ())
            else:
                writes.append(tuple(i for i in kernel if allocates[i]))
        self.produced = {o for w in writes for o in w}

    @property
    def preds(self) -> list[set[int]]:
        """Per kernel: the kernels it waits for."""
        preds: list[set[int]] = [set() for _ in self.reads]
        for p, waiting in enumerate(self.succs):
            for k in waiting:
                preds[k].add(p)
        return preds

    @property
    def succs(self) -> list[list[int]]:
        """Per kernel: the kernels that wait for it, in order."""
        return self._dependencies()[1]

    def _dependencies(self) -> tuple[list[int], list[list[int]]]:
        """(per kernel: how many kernels it waits for, `succs`), found once."""
        if self._links is None:
            a, nodes, order, position, through = self._graph
            after = self._after(a, order, position, through)
            distinct = a.distinct
            succs: list[list[int]] = [[] for _ in nodes]
            indegree = [0] * len(nodes)
            seen = [-1] * len(nodes)  # per kernel: the last kernel found waiting for it (each is counted once)
            for k, kernel in enumerate(nodes):
                seen[k] = k  # no kernel waits for itself
                for i in kernel:
                    for j in distinct[i]:
                        found = after[j]
                        if found is not None:
                            for p in found:
                                if seen[p] != k:
                                    seen[p] = k
                                    succs[p].append(k)
                                    indegree[k] += 1
            self._links = (indegree, succs)
        return self._links

    @functools.cached_property
    def _ends(self) -> tuple[int, int]:
        """(bytes live before the first kernel: the inputs the module may free; bytes live after the last: the
        outputs it allocates), whatever the order."""
        return (
            sum(self.size[o] for o in self.readers if o not in self.produced),
            sum(self.size[o] for o in self.produced if self.outputs[o]),
        )

    def floor(self) -> int:
        """What every order's estimate reaches: the larger of the two ends (_ends)."""
        return max(self._ends)

    @staticmethod
    def _after(a, order: Sequence[int], position: list[int], through: bytearray) -> list[tuple[int, ...] | None]:
        """Per node of the module, the kernels a reader of it must run after: its own, or, for a view or a value
        computed inside its readers (`through`), those of what it reads (within the module); None for other nodes.
        One pass in `order`, which puts every node after its inputs."""
        after: list[tuple[int, ...] | None] = [None] * len(a.names)
        distinct = a.distinct
        for i in order:
            p = position[i]
            if p >= 0:
                after[i] = (p,)
            elif through[i]:
                found: dict[int, None] = {}
                for j in distinct[i]:
                    for q in after[j] or ():
                        found[q] = None
                after[i] = tuple(found)
        return after

    def estimate(self, seq: Sequence[int]) -> int:
        """inductor's peak estimate of running the kernels in `seq`: the inputs it may free live from the start to
        their last reader, each buffer from its kernel to its last reader, the outputs to the end."""
        reads, writes, size, outputs, produced = self.reads, self.writes, self.size, self.outputs, self.produced
        last: dict[int, int] = {}
        for step, k in enumerate(seq):
            for o in reads[k]:
                last[o] = step
        delta = [0] * (len(seq) + 1)
        start = 0
        for o, step in last.items():
            if o not in produced:
                start += size[o]
                delta[step + 1] -= size[o]
        for step, k in enumerate(seq):
            for o in writes[k]:
                delta[step] += size[o]
                if not outputs[o]:
                    delta[last.get(o, step) + 1] -= size[o]
        return max(itertools.accumulate(delta[:-1], initial=start))

    def least_peak_first(self, limit: int | None = None) -> list[int] | None:
        """memory.topological_sort_lpmf: among the ready kernels, one whose allocation stays within the peak so far
        and that leaves the least memory live after it; else the one that allocates least; ties in given order.
        None as soon as the memory live under it reaches `limit`: its estimate (the most ever live) cannot be lower.

        The ready kernels are grouped by the bytes they allocate, each group a heap on (net allocation, position)
        with stale entries dropped lazily (a kernel's net allocation only falls, as the buffers it reads lose their
        other readers): a step looks at one entry per group, not at every ready kernel."""
        size, reads, writes, outputs = self.size, self.reads, self.writes, self.outputs
        indegree = list(self._dependencies()[0])
        outdegree = {o: len(r) + outputs[o] for o, r in self.readers.items()}  # readers left, +1 for an output
        alloc = [0] * len(reads)
        net = [0] * len(reads)
        for k in range(len(reads)):
            frees = 0
            for o in reads[k]:
                if outdegree[o] == 1:
                    frees += size[o]
            for o in writes[k]:
                alloc[k] += size[o]
                if outdegree.setdefault(o, outputs[o]) == 0:
                    frees += size[o]
            net[k] = alloc[k] - frees
        live, kept = self._ends
        peak = max(live, kept)
        sizes = sorted(set(alloc))  # the groups' allocations, ascending
        rank = {ak: g for g, ak in enumerate(sizes)}
        heaps: list[list[tuple[int, int]]] = [[] for _ in sizes]  # per group: a heap of (net, kernel)
        group = [rank[ak] for ak in alloc]
        is_ready = bytearray(len(reads))
        for k in range(len(reads)):
            if not indegree[k]:
                is_ready[k] = 1
                heaps[group[k]].append((net[k], k))
        for heap in heaps:
            heapq.heapify(heap)
        bound = math.inf if limit is None else limit
        if live >= bound:
            return None
        succs, readers = self.succs, self.readers
        pop, push = heapq.heappop, heapq.heappush
        order: list[int] = []
        remaining = sum(is_ready)
        while remaining:
            gap = peak - live
            # the least (allocation beyond the gap, net allocation, position): of the groups allocating within the
            # gap, the least heap top; where none has a ready kernel, the top of the least allocation above it
            best: tuple[int, int] | None = None
            for g, heap in enumerate(heaps):
                while heap:
                    top = heap[0]
                    if is_ready[top[1]] and top[0] == net[top[1]]:
                        break
                    pop(heap)
                else:
                    continue
                if sizes[g] > gap:
                    if best is None:
                        best = top
                    break
                if best is None or top < best:
                    best = top
            assert best is not None
            chosen = best[1]
            pop(heaps[group[chosen]])
            is_ready[chosen] = 0
            remaining -= 1
            order.append(chosen)
            live += alloc[chosen]
            if live >= bound:
                return None
            if live > peak:
                peak = live
            live -= alloc[chosen] - net[chosen]
            for s in succs[chosen]:
                indegree[s] -= 1
                if not indegree[s]:
                    is_ready[s] = 1
                    remaining += 1
                    push(heaps[group[s]], (net[s], s))
            for o in reads[chosen]:
                outdegree[o] -= 1
                if outdegree[o] == 1:
                    for r in readers[o]:
                        net[r] -= size[o]
                        if is_ready[r]:
                            push(heaps[group[r]], (net[r], r))
        return order
