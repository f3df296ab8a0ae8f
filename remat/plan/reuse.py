"""inductor's buffer reuse, as the simulation models it (fusion.py lists the habits): a released buffer kept for the
module's next allocation of its size, and a loop writing its output over a buffer it reads for the last time.

Pure functions of the graph arrays, one plan's lifetimes and the modules' schedules.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from .fusion import OPAQUE, expand


def reuse(
    spans: list[tuple[int, int, int]], keys: Sequence, boundary: int, sizes: Sequence[int] | None = None
) -> list[tuple[int, int, int]]:
    """inductor's buffer reuse: a buffer its module allocated and no longer reads is not freed at once but kept for
    the module's next allocation of the same dtype and size (the most recently released first), so it stays live
    until then — unless holding it that long would raise the module's peak: inductor estimates each kernel's live
    memory without reuse and lets an allocation take the buffer only if the estimate's peak between the release
    and the allocation, plus the buffer, stays within the module's overall estimated peak
    (AllocateLine.should_reuse_buffer); otherwise the buffer goes back to the pool and the allocation is new.

    `spans`: (owner, first step, last step); `keys[owner]`: what must match; `sizes[owner]`: its bytes (None: every
    buffer is held until the next allocation of its size, a bound where the kernels do not run in schedule order and
    the estimate would not be inductor's); `boundary`: the first backward step. Forward and backward are separate
    modules: a buffer is reused only within the module that allocated and released it, and values passed from one
    to the other are never reused (they count in the estimate)."""
    firsts = [first for _, first, _ in spans]
    lasts = [last for _, _, last in spans]
    key = [keys[owner] for owner, _, _ in spans]
    size = [sizes[owner] if sizes is not None else 0 for owner, _, _ in spans]
    ends = list(lasts)
    steps = max(lasts, default=-1) + 2
    delta = [0] * (steps + 1)
    if sizes is not None:
        for k in range(len(spans)):
            delta[firsts[k]] += size[k]
            delta[lasts[k] + 1] -= size[k]
    live = list(itertools.accumulate(delta))  # estimated live bytes per step, without reuse
    for lo, hi, module in (
        (0, boundary, [k for k in range(len(spans)) if firsts[k] < boundary and lasts[k] < boundary]),
        (boundary, steps, [k for k in range(len(spans)) if firsts[k] >= boundary and lasts[k] >= boundary]),
    ):
        peak = max(live[lo:hi], default=0)
        # Steps in order; at a step, a kernel's outputs are allocated before it runs, and what it read last is
        # released after: an allocation at step s can take only buffers released before s. Sorting is stable, so
        # spans of one step keep their order.
        releases = sorted(module, key=lasts.__getitem__)
        pool: dict[object, list[int]] = {}
        released = 0
        for k in sorted(module, key=firsts.__getitem__):
            step = firsts[k]
            while released < len(releases) and lasts[releases[released]] < step:
                free = releases[released]
                pool.setdefault(key[free], []).append(free)
                released += 1
            taken = pool.get(key[k])
            if not taken:
                continue
            free = taken[-1]
            held = range(lasts[free] + 1, step)  # the steps the buffer would be held over
            if sizes is not None:
                if max((live[s] for s in held), default=0) + size[free] > peak:
                    continue  # a new allocation; the buffer stays in the pool for a later one
                for s in held:
                    live[s] += size[free]
            taken.pop()
            ends[free] = step - 1  # held until this allocation takes it over
    out = list(spans)
    for k in range(len(spans)):
        if ends[k] != lasts[k]:
            out[k] = (spans[k][0], firsts[k], ends[k])
    return out


def in_place(problem, resolved, forward, backward, recomputed, alloc, last, segment) -> None:
    """inductor's in-place buffers (torch._inductor.config.inplace_buffers): a loop that reads a buffer for the last
    time, element for element as it writes its output (not through a view), and of the same dtype and size, writes
    its output into that buffer, which ends the step before (`last`). A saved value counts: backward frees the
    values it is handed. Not a recomputed loop's buffer: inductor computes a recomputed loop inside the kernels of
    its segment that read it more often than fusion.inlined finds, and a buffer that is never written out is not
    there to take. Values that leave the device keep their own lifetimes (simulate._split_transfers).
    `forward`, `backward`: each module's (schedule, values computed inside other kernels, fusion.expand's memo);
    `segment`: the backward segment of each node (fusion.segments; 0 in the forward), within which inductor fuses."""
    a = problem.arrays
    n = len(a.names)
    storage, kinds, keys, plain = a.storage, a.kinds, a.reuse_keys, problem.instances
    leaving = {a.index[s] for s in resolved.moves}
    taken: set[int] = set()
    step = -1
    for in_bw, (order, inside, memo) in enumerate((forward, backward)):
        loops = [i for i in order if not inside[i] and kinds[i] != OPAQUE and a.allocates[i]]
        readers: dict[int, list[int]] = {}
        for i in loops:
            for j in expand(a, i, inside, memo):
                readers.setdefault(storage[j], []).append(i)
        loops_set = set(loops)
        for i in order:
            step += 1
            if i not in loops_set:
                continue
            for j in expand(a, i, inside, memo):
                if storage[j] != j or keys[j] != keys[i] or j in leaving:
                    continue
                if in_bw and recomputed[j] and kinds[j] != OPAQUE:
                    continue
                k = j + n if in_bw and recomputed[j] else plain[j]
                if k >= 0 and k not in taken and last[k] == step and 0 <= alloc[k] < step:
                    others = tuple(r for r in readers[j] if segment[r] == segment[i] and r != i)
                    if not _sole_reader(a, i, others, problem.sole_readers):
                        continue
                    taken.add(k)
                    last[k] = step - 1
                    break


def _sole_reader(a, i: int, others: tuple[int, ...], memo: dict[tuple[int, tuple[int, ...]], bool]) -> bool:
    """Whether loop `i` may take over a buffer the loops `others` of its segment read too: inductor writes in place
    only when every other loop reading the buffer is one `i` depends on or ran in an earlier kernel. A loop of the same
    segment reading the same buffer that `i` does not depend on is fused with `i` into one kernel (they share the
    read), so the buffer is still being read while `i` writes; one of another segment ran in a kernel of its own.
    The answer depends on the graph alone: `memo` (Problem.sole_readers) keeps it for the next plan that asks."""
    if not others:
        return True
    key = (i, others)
    found = memo.get(key)
    if found is None:
        found = memo[key] = _ancestors_all(a, i, others)
    return found


def _ancestors_all(a, i: int, others: tuple[int, ...]) -> bool:
    """Whether every node of `others` is an ancestor of node `i` (a search back from `i`, no deeper than the lowest
    of them: positions are in graph order, so an ancestor precedes what reads it)."""
    lowest = min(others)
    pending, seen = set(others), {i}
    stack = [i]
    while stack and pending:
        for v in a.distinct[stack.pop()]:
            pending.discard(v)
            if v > lowest and v not in seen:
                seen.add(v)
                stack.append(v)
    return not pending
