"""inductor's buffer reuse, as the simulation models it (one of fusion.py's habits of inductor).

inductor's wrapper does not free a buffer its module no longer reads at once: it keeps it for the module's next
allocation of the same dtype and size, so the buffer stays live until then. Only what inductor allocates can take
such a buffer: a loop's output, a concatenation's, a matmul's (a library call it hands a buffer to write into). A
fallback (a library call that allocates its own outputs: attention on CPU, convolution, a random op under
fallback_random, a custom op such as remat's runtime ops) takes none, though its outputs join the pool once freed.

Pure functions of the graph facts and the spans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..capture import Graph
from . import fusion


def allocated_by_inductor(graph: Graph, v, fallbacks: frozenset[str]) -> bool:
    """Whether inductor allocates the buffer `v` is written to (a loop's, a concatenation's, an out= library
    call's such as a matmul's), so that it may take a buffer freed before (`reuse`). The outputs of a fallback (an
    op in `fallbacks`, _torch.inductor_fallback_ops; an aten random op, which inductor runs as a fallback whenever
    it is left in the graph: fallback_random; a custom op, remat's runtime ops among them), and the tuple items
    picked from them, are allocated by the op itself."""
    if v.op == "getitem" and v.inputs:
        v = graph[v.inputs[0]]
    if fusion.kind(v) != fusion.OPAQUE or v.op.startswith("prims.inductor_"):
        return True
    if v.op in fallbacks or not v.op.startswith(("aten.", "prims.")):
        return False
    return "nondeterministic_seeded" not in v.tags


def reuse(
    spans: list[tuple[int, int, int]],
    keys: Sequence,
    sizes: Sequence[int],
    boundary: int,
    takes: Sequence[bool],
    scratch_from: int,
    kernels: Sequence[int],
    estimated: list[tuple[int, int, int]] | None = None,
) -> list[tuple[int, int, int]]:
    """inductor's buffer reuse: a buffer its module allocated and no longer reads is not freed at once but kept for
    the module's next allocation of the same dtype and size (the most recently released first), so it stays live
    until then — where inductor's estimate of the module's memory says holding it does not raise the module's peak
    (wrapper.AllocateLine.should_reuse_buffer: the allocation's bytes plus the most estimated live between the
    release and the allocation, at most the estimated peak; always when no kernel runs between: `kernels[s]` counts
    the steps up to s that run a kernel, not a view or a value computed inside another kernel). The estimate is the
    simulation's live bytes without the holds, updated as each hold is taken, less the scratch of library calls,
    which inductor does not see; `estimated`, where given, holds the spans it counts instead of `spans`, one for
    one: a value copied into a contiguous arena is, to inductor, a buffer its store op returns, which the forward
    returns and the backward frees after its last read (arena.pack). inductor's estimate also counts the
    gradients the backward returns, from their kernel to its end; this one leaves them out, as the simulation does:
    counted, they put the benchmark GPT-style model's least-peak plan 10.5% under its measured peak.

    `spans`: (owner, first step, last step), those from `scratch_from` on a library call's scratch (taking and giving
    no buffer); `keys[owner]`, `sizes[owner]`: what must match, its bytes; `boundary`: the first backward step;
    `takes[owner]`: inductor allocates its buffer (allocated_by_inductor) — a fallback op's output takes no freed
    buffer, though its own goes to the pool when freed. Forward and backward are separate modules: a buffer is reused
    only within the module that allocated and released it, and values passed from one to the other are never
    reused."""
    if not spans:
        return []
    owners, firsts, lasts = (list(column) for column in zip(*spans))
    key = list(map(keys.__getitem__, owners))
    size = list(map(sizes.__getitem__, owners))
    ends = list(lasts)
    end = max(lasts) + 1
    plain = min(scratch_from, len(spans))  # the spans before it take and give buffers
    # the spans inductor's estimate counts: (first steps, last steps, bytes)
    counted: tuple[Sequence[int], Sequence[int], Sequence[int]] = (firsts[:plain], lasts[:plain], size[:plain])
    if estimated is not None and estimated is not spans:
        seen_owners, seen_firsts, seen_lasts = zip(*estimated[:plain]) if plain else ((), (), ())
        counted = (seen_firsts, seen_lasts, list(map(sizes.__getitem__, seen_owners)))
    first_at = np.array(firsts[:plain], dtype=np.int64)
    last_at = np.array(lasts[:plain], dtype=np.int64)
    for lo, hi in ((0, boundary), (boundary, max(end, boundary))):
        module = np.flatnonzero((first_at >= lo) & (last_at < hi))
        if not len(module):
            continue
        estimate = _estimate(counted[0], counted[1], counted[2], lo, hi)
        peak = max(estimate)
        # Steps in order; at a step, a kernel's outputs are allocated before it runs, and what it read last is
        # released after: an allocation at step s can take only buffers released before s. Sorting is stable, so
        # spans of one step keep their order.
        releases = module[np.argsort(last_at[module], kind="stable")].tolist()
        pool: dict[object, list[int]] = {}
        released = 0
        for k in module[np.argsort(first_at[module], kind="stable")].tolist():
            step = firsts[k]
            while released < len(releases) and lasts[releases[released]] < step:
                free = releases[released]
                pool.setdefault(key[free], []).append(free)
                released += 1
            taken = pool.get(key[k]) if takes[owners[k]] else None
            if not taken:
                continue
            released_at = lasts[taken[-1]]
            if kernels[step - 1] > kernels[released_at]:  # a kernel runs between release and allocation
                grow = size[k]
                # the held steps: mostly a few, so plain lists beat numpy's per-call cost
                if grow + max(estimate[released_at + 1 - lo : step - lo]) > peak:
                    continue  # inductor allocates anew, and the freed buffer stays in the pool
                for at in range(released_at + 1 - lo, step - lo):
                    estimate[at] += grow
            ends[taken.pop()] = step - 1  # held until this allocation takes it over
    out = list(spans)
    for k in range(len(spans)):
        if ends[k] != lasts[k]:
            out[k] = (spans[k][0], firsts[k], ends[k])
    return out


def _estimate(firsts: Sequence[int], lasts: Sequence[int], sizes: Sequence[int], lo: int, hi: int) -> list[int]:
    """Bytes live at each step of [lo, hi) over the spans (first step, last step, bytes), clipped to it."""
    first = np.maximum(np.asarray(firsts, dtype=np.int64), lo)
    last = np.minimum(np.asarray(lasts, dtype=np.int64), hi - 1)
    inside = first <= last
    size = np.asarray(sizes, dtype=np.float64)[inside]
    first, last = first[inside] - lo, last[inside] - lo
    delta = np.bincount(first, size, hi - lo + 1) - np.bincount(last + 1, size, hi - lo + 1)
    return np.cumsum(delta[:-1]).astype(np.int64).tolist()
