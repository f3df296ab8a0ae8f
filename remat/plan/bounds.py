"""Lower bounds on a plan's simulated peak (simulate.py), found without simulating it: `evaluate.pick` passes over a
plan whose bound is above its budget, and the least-peak search over one whose bound is above the least peak found.

- Every plan: the saved storages the device keeps are all allocated in forward and read in backward, so all are
  live together as the forward ends (saved_floor).
- contiguous=True: the arena is live for the whole step (arena.pack), so at the step of any backward library call
  the arena is live together with what that call needs (arena_floor). A library call (an opaque op: a matmul,
  attention's backward, a fallback) is never computed inside another kernel and never writes its output over a
  buffer (fusion.in_place: only loops do, and a loop writing over a packed value writes into its arena slot). So at
  its step its outputs and scratch are live, and so are the buffers of other library calls that it reads: gradients,
  and the forward values it reads where they are recomputed (saved ones are in the arena).

Pure functions of the graph facts and the plan.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..runtime.table import arena_slot_bytes
from .arrays import BACKWARD, FORWARD
from .fusion import OPAQUE
from .transfer import packed

if TYPE_CHECKING:
    from .problem import Problem, Resolved


@dataclasses.dataclass(frozen=True)
class Call:
    """A backward library call, as the arena floor counts it."""

    live: int  # bytes live at its step in every plan: its outputs, its scratch, the gradients it reads
    recomputed: tuple[int, ...]  # forward storages it reads that library calls make: live when recomputed


def saved_floor(problem: Problem, resolved: Resolved) -> int:
    """The bytes of the saved storages the device keeps (every one is live as the forward ends). Those that leave
    the device and the gradients the step returns are left out."""
    a = problem.arrays
    leaving = resolved.sharded | resolved.offloaded
    owners = {a.storage[a.index[s]] for s in resolved.saved if s not in leaving}
    return sum(a.nbytes[o] for o in owners if _counted(problem, o))


def _counted(problem: Problem, owner: int) -> bool:
    """Whether the simulation counts storage `owner`: it has bytes, is an activation (not an input, a tangent or
    another uncounted storage) and is no gradient the step returns."""
    a = problem.arrays
    return (
        a.allocates[owner]
        and a.nbytes[owner] > 0
        and a.instances[owner] >= 0
        and owner not in problem.excluded_storages
    )


def floor(problem: Problem, resolved: Resolved) -> int:
    """The best lower bound on the plan's simulated peak this module finds."""
    found = saved_floor(problem, resolved)
    if problem.transfer.contiguous:
        found = max(found, arena_floor(problem, resolved))
    return found


def arena_floor(problem: Problem, resolved: Resolved) -> int:
    """contiguous=True: the arena's bytes plus the most any backward library call needs live at its step
    (Problem.library_calls), as the simulation counts them."""
    a = problem.arrays
    nbytes = a.nbytes
    stored = packed(problem.graph, resolved.saved, resolved.moves)
    arena = sum(arena_slot_bytes(nbytes[a.index[name]]) for name in stored)
    recomputed = {a.index[name] for name in resolved.recomputed}
    needs = (call.live + sum(nbytes[o] for o in call.recomputed if o in recomputed) for call in problem.library_calls)
    return arena + max(needs, default=0)


def library_calls(problem: Problem) -> tuple[Call, ...]:
    """The backward library calls of the graph (each distinct Call once): the backward nodes every plan runs that
    are opaque ops, not views, and not an mm that inductor may compute inside an addmm."""
    a = problem.arrays
    role, storage, nbytes, kinds = a.role, a.storage, a.nbytes, a.kinds

    calls: dict[Call, None] = {}
    for i in problem.backward_positions:
        if role[i] != BACKWARD or kinds[i] != OPAQUE or a.is_view[i] or a.folds[i] >= 0:
            continue
        live = {m: nbytes[m] for m in (i, *a.getitems[i]) if role[m] == BACKWARD and _counted(problem, m)}  # outputs
        recomputed: list[int] = []
        for j in a.distinct[i]:
            o = storage[j]
            if o in live or kinds[o] != OPAQUE or not _counted(problem, o):
                continue
            if role[o] == BACKWARD:
                live[o] = nbytes[o]
            elif role[o] == FORWARD and o not in recomputed:
                recomputed.append(o)
        scratch = nbytes[a.workspace[i]] if a.workspace[i] >= 0 else 0
        calls[Call(sum(live.values()) + scratch, tuple(recomputed))] = None
    return tuple(calls)
