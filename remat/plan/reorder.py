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

import numpy as np

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
    planning sees them (memory.py: MemoryPlanningInfoForNode / ForBuffer): buffers numbered from 0 (`buffers`: their
    storages), each read and write a (kernel, buffer) pair of flat arrays. What the greedy order walks (what each
    kernel reads and waits for, each buffer's readers) is made when first read, as flat lists (_flat): the estimate of
    the given order needs none of it. `reads`, `writes`, `readers` and `succs` give them per kernel or buffer."""

    def __init__(
        self,
        a,
        nodes: list[tuple[int, ...]],
        inside: bytearray,
        outputs: bytearray,
        memo: dict,
        order: Sequence[int],
        through: bytearray,
    ) -> None:
        v = a.vectors
        storage, nbytes, instances, allocates = v.storage, v.nbytes, v.instances, v.allocates
        count = len(nodes)
        flat = list(itertools.chain.from_iterable(nodes))
        computed = np.array(flat, dtype=np.intp)
        kernel_of = np.arange(count, dtype=np.intp)  # per node of `flat`: its kernel
        if len(flat) != count:
            kernel_of = np.repeat(kernel_of, [len(kernel) for kernel in nodes])
        position = np.full(len(a.names), -1, dtype=np.intp)  # per node: the kernel computing it
        position[computed] = kernel_of
        read, reader = fusion.expand_flat(a, computed, inside, memo)
        read, reader = storage[read], kernel_of[reader]
        # counted: a buffer of the module, or an input it may free (a saved activation; never a parameter)
        counted = (nbytes[read] > 0) & ((position[read] >= 0) | (instances[read] >= 0))
        read, reader = read[counted], reader[counted]
        writes = allocates[computed]
        self.buffers, ids = np.unique(np.concatenate([read, computed[writes]]), return_inverse=True)
        number = len(self.buffers)
        pairs = _distinct_sorted(reader * number + ids[: len(read)])
        self._read_kernel, self._read_buffer = pairs // number, pairs % number
        self._write_kernel, self._write_buffer = kernel_of[writes], ids[len(read) :]
        self._count = count
        self._size = nbytes[self.buffers]
        self._outputs = np.frombuffer(outputs, dtype=np.uint8)[self.buffers].astype(bool)
        self._produced = np.zeros(number, dtype=bool)
        self._produced[self._write_buffer] = True
        self._reader_count = np.bincount(self._read_buffer, minlength=number)  # per buffer: how many kernels read it
        self._graph = (a, computed, kernel_of, position, order, through)
        self._links: tuple[list[int], list[int], list[int]] | None = None

    @functools.cached_property
    def size(self) -> list[int]:
        """Bytes per buffer."""
        return self._size.tolist()

    @functools.cached_property
    def outputs(self) -> list[bool]:
        """Per buffer: the module returns it (never freed)."""
        return self._outputs.tolist()

    @functools.cached_property
    def produced(self) -> set[int]:
        """The buffers the module allocates."""
        return set(np.flatnonzero(self._produced).tolist())

    @property
    def reads(self) -> list[tuple[int, ...]]:
        """Per kernel: the counted buffers it reads."""
        return _grouped(*self._reads_flat, tuple)

    @functools.cached_property
    def _reads_flat(self) -> tuple[list[int], list[int]]:
        return _flat(self._read_kernel, self._read_buffer, self._count)

    @property
    def writes(self) -> list[tuple[int, ...]]:
        """Per kernel: the buffers it allocates."""
        return _grouped(*_flat(self._write_kernel, self._write_buffer, self._count), tuple)

    @property
    def readers(self) -> list[list[int]]:
        """Per buffer: the kernels reading it, in order."""
        return _grouped(*self._readers_flat, list)

    @functools.cached_property
    def _readers_flat(self) -> tuple[list[int], list[int]]:
        by_buffer = np.argsort(self._read_buffer, kind="stable")
        return _flat(self._read_buffer[by_buffer], self._read_kernel[by_buffer], len(self.buffers))

    @property
    def succs(self) -> list[list[int]]:
        """Per kernel: the kernels that wait for it, in order."""
        return _grouped(*self._dependencies()[1:], list)

    def _dependencies(self) -> tuple[list[int], list[int], list[int]]:
        """(per kernel: how many kernels it waits for; `succs` flat, as _flat's pair), found once: a kernel waits for
        the kernel computing each of its nodes' inputs, and for those an input of it that is a view or computed inside
        its readers waits for (_after)."""
        if self._links is None:
            a, computed, kernel_of, position, order, through = self._graph
            read, lengths = a.flat_inputs(computed)
            reader = np.repeat(kernel_of, lengths)
            waited = position[read]
            found = waited >= 0
            pairs = [waited[found] * self._count + reader[found]]
            after = self._after(a, position, order, through)
            if after:
                marked = np.zeros(len(position), dtype=bool)
                marked[list(after)] = True
                via = np.flatnonzero(marked[read])
                reads = zip(read[via].tolist(), reader[via].tolist())
                pairs.append(np.array([p * self._count + k for j, k in reads for p in after[j]], dtype=np.intp))
            links = np.concatenate(pairs)
            links = _distinct_sorted(links[links // self._count != links % self._count])
            waited, waiting = links // self._count, links % self._count
            indegree = np.bincount(waiting, minlength=self._count).tolist()
            self._links = (indegree, *_flat(waited, waiting, self._count))
        return self._links

    @staticmethod
    def _after(a, position: np.ndarray, order: Sequence[int], through: bytearray) -> dict[int, tuple[int, ...]]:
        """Per node of the module that is a view or a value computed inside its readers (`through`): the kernels a
        reader of it must run after, those of what it reads within the module; only nodes with some. One pass in
        `order`, which puts every node after its inputs."""
        nodes = np.asarray(order, dtype=np.intp)
        kernel = position.tolist()
        distinct = a.distinct
        after: dict[int, tuple[int, ...]] = {}
        for i in nodes[np.frombuffer(through, dtype=np.uint8)[nodes].astype(bool)].tolist():
            inputs = distinct[i]
            if len(inputs) == 1:  # most views: one input
                p = kernel[inputs[0]]
                if p >= 0:
                    after[i] = (p,)
                elif inputs[0] in after:
                    after[i] = after[inputs[0]]
                continue
            found: dict[int, None] = {}
            for j in inputs:
                p = kernel[j]
                if p >= 0:
                    found[p] = None
                elif j in after:
                    found.update(dict.fromkeys(after[j]))
            if found:
                after[i] = tuple(found)
        return after

    @functools.cached_property
    def _ends(self) -> tuple[int, int]:
        """(bytes live before the first kernel: the inputs the module may free; bytes live after the last: the
        outputs it allocates), whatever the order."""
        size, produced = self._size, self._produced
        return int(size[(self._reader_count > 0) & ~produced].sum()), int(size[produced & self._outputs].sum())

    def floor(self) -> int:
        """What every order's estimate reaches: the larger of the two ends (_ends)."""
        return max(self._ends)

    def estimate(self, seq: Sequence[int]) -> int:
        """inductor's peak estimate of running the kernels in `seq` (each kernel once): the inputs it may free live
        from the start to their last reader, each buffer from its kernel to its last reader, the outputs to the end."""
        count, size, buffer = self._count, self._size, self._write_buffer
        step = np.empty(count, dtype=np.intp)  # per kernel: where it runs
        step[np.asarray(seq, dtype=np.intp)] = np.arange(count)
        last = np.full(len(self.buffers), -1, dtype=np.intp)  # per buffer: the step of its last reader
        np.maximum.at(last, self._read_buffer, step[self._read_kernel])
        delta = np.zeros(count + 1, dtype=np.int64)
        inputs = (last >= 0) & ~self._produced
        start = int(size[inputs].sum())
        np.subtract.at(delta, last[inputs] + 1, size[inputs])
        written = step[self._write_kernel]
        np.add.at(delta, written, size[buffer])
        freed = ~self._outputs[buffer]
        np.subtract.at(delta, np.maximum(last[buffer], written)[freed] + 1, size[buffer][freed])
        return max(start, int((start + np.cumsum(delta[:-1])).max(initial=start)))

    def _allocations(self) -> tuple[list[int], list[int], list[int]]:
        """(per kernel: the bytes it allocates, and those less the bytes it frees, when no kernel has run; per buffer:
        the kernels left to read it, +1 for an output)."""
        size, count = self._size, self._count
        outdegree = self._reader_count + self._outputs
        alloc = np.zeros(count, dtype=np.int64)
        np.add.at(alloc, self._write_kernel, size[self._write_buffer])
        net = alloc.copy()
        last = outdegree[self._read_buffer] == 1  # read by one kernel: freed after it
        np.subtract.at(net, self._read_kernel[last], size[self._read_buffer][last])
        unread = outdegree[self._write_buffer] == 0  # written and never read: freed after its kernel
        np.subtract.at(net, self._write_kernel[unread], size[self._write_buffer][unread])
        return alloc.tolist(), net.tolist(), outdegree.tolist()

    def least_peak_first(self, limit: int | None = None) -> list[int] | None:
        """memory.topological_sort_lpmf: among the ready kernels, one whose allocation stays within the peak so far
        and that leaves the least memory live after it; else the one that allocates least; ties in given order.
        None as soon as the memory live under it reaches `limit`: its estimate (the most ever live) cannot be lower.

        The ready kernels are one heap on (net allocation, position), stale entries dropped lazily (a kernel's net
        allocation only falls, as the buffers it reads lose their other readers): a step takes the top where its
        allocation stays within the peak so far, as it nearly always does, and looks over every ready kernel only
        where it does not."""
        size, count = self.size, self._count
        indegree, succ_starts, succs = self._dependencies()
        indegree = list(indegree)
        alloc, net, outdegree = self._allocations()
        live, kept = self._ends
        peak = max(live, kept)
        bound = math.inf if limit is None else limit
        if live >= bound:
            return None
        # heap entries are net * count + kernel: one int orders as the pair (net allocation, position) does
        heap = [net[k] * count + k for k in range(count) if not indegree[k]]
        heapq.heapify(heap)
        is_ready = bytearray(count)
        for entry in heap:
            is_ready[entry % count] = 1
        (read_starts, reads), (reader_starts, readers) = self._reads_flat, self._readers_flat
        pop, push = heapq.heappop, heapq.heappush
        order: list[int] = []
        remaining = len(heap)
        while remaining:
            while True:
                net_k, chosen = divmod(heap[0], count)
                if is_ready[chosen] and net_k == net[chosen]:
                    break
                pop(heap)
            if alloc[chosen] <= peak - live:
                pop(heap)
            else:
                chosen = _least_beyond(heap, count, is_ready, net, alloc, peak - live)
            is_ready[chosen] = 0  # its entry, where still in the heap, is stale
            remaining -= 1
            order.append(chosen)
            live += alloc[chosen]
            if live >= bound:
                return None
            if live > peak:
                peak = live
            live -= alloc[chosen] - net[chosen]
            for s in succs[succ_starts[chosen] : succ_starts[chosen + 1]]:
                indegree[s] -= 1
                if not indegree[s]:
                    is_ready[s] = 1
                    remaining += 1
                    push(heap, net[s] * count + s)
            for o in reads[read_starts[chosen] : read_starts[chosen + 1]]:
                outdegree[o] -= 1
                if outdegree[o] == 1:
                    for r in readers[reader_starts[o] : reader_starts[o + 1]]:
                        net[r] -= size[o]
                        if is_ready[r]:
                            push(heap, net[r] * count + r)
        return order


def _least_beyond(heap: list[int], count: int, is_ready: bytearray, net: list[int], alloc: list[int], gap: int) -> int:
    """least_peak_first's choice where the least (net allocation, position) of the ready kernels allocates more than
    `gap`: the least of those allocating within it, else the least of those allocating least. `heap`'s entries
    are net * count + kernel (stale ones among them)."""
    ready = [
        (alloc[entry % count], entry)
        for entry in heap
        if is_ready[entry % count] and entry // count == net[entry % count]
    ]
    within = [entry for allocated, entry in ready if allocated <= gap]
    return (min(within) if within else min(ready)[1]) % count


def _distinct_sorted(keys: np.ndarray) -> np.ndarray:
    """`keys` sorted, each once (a stable sort: the keys come nearly sorted)."""
    keys = np.sort(keys, kind="stable")
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) > 1 else keys


def _flat(keys: np.ndarray, values: np.ndarray, count: int) -> tuple[list[int], list[int]]:
    """(starts, flat): the values of key k in range(count) are flat[starts[k] : starts[k + 1]], in order (`keys`
    sorted). The greedy order slices them as it goes, rather than make and free a list per key up front."""
    return np.searchsorted(keys, np.arange(count + 1)).tolist(), values.tolist()


def _grouped(starts: list[int], flat: list[int], kind) -> list:
    """Per key: a `kind` (tuple or list) of its values (_flat's)."""
    return [kind(flat[i:j]) for i, j in itertools.pairwise(starts)]
