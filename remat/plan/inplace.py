"""inductor's in-place buffers (torch._inductor.config.inplace_buffers), as the simulation models it (one of fusion.py's
habits of inductor): a loop writes its output over a buffer of its size it reads for the last time, unless a loop it
does not depend on reads that buffer too.

Pure functions of the graph facts and the plan's steps.
"""

from __future__ import annotations

from .fusion import OPAQUE, expand


def in_place(problem, resolved, forward, backward, recomputed, alloc, last, segment) -> dict[int, int]:
    """inductor's in-place buffers (torch._inductor.config.inplace_buffers): a loop that reads a buffer for the last
    time, element for element as it writes its output (not through a view), and of the same dtype and size, writes
    its output into that buffer, which ends the step before (`last`). A saved value counts: backward frees the
    values it is handed. Not a recomputed loop's buffer: inductor computes a recomputed loop inside the kernels of
    its segment that read it more often than fusion.inlined finds, and a buffer that is never written out is not
    there to take. Values that leave the device keep their own lifetimes (simulate._split_transfers).
    `forward`, `backward`: each module's (schedule, values computed inside other kernels, fusion.expand's memo);
    `segment`: the backward segment of each node (fusion.segments; 0 in the forward), within which inductor fuses.
    Returns, per storage instance taken, the instance of the loop's output written into it."""
    a = problem.arrays
    n = len(a.names)
    storage, kinds, keys, plain = a.storage, a.kinds, a.reuse_keys, problem.instances
    leaving = {a.index[s] for s in resolved.moves}
    taken: dict[int, int] = {}
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
                    found = readers[j]
                    others = tuple(r for r in found if segment[r] == segment[i] and r != i) if len(found) > 1 else ()
                    if not _sole_reader(a, i, others, problem.sole_readers):
                        continue
                    taken[k] = i + n if in_bw and recomputed[i] else plain[i]
                    last[k] = step - 1
                    break
    return taken


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
