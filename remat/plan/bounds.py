"""Lower bounds on a plan's simulated peak (simulate.py), found without simulating it: `evaluate.pick` passes over a
plan whose bound is above its budget, and the least-peak search over one whose bound is above the least peak found.

- Every plan: the saved storages the device keeps are all allocated in forward and read in backward, so all are
  live together as the forward ends (saved_floor).
- contiguous=True: the arena is live for the whole step (arena.pack), so at the step of any backward library call
  the arena is live together with what that call needs (arena_floor). A library call (an opaque op: a matmul,
  attention's backward, a fallback) is never computed inside another kernel and never writes its output over a
  buffer (inplace.in_place: only loops do, and a loop writing over a packed value writes into its arena slot). So at
  its step its outputs and scratch are live, and so are the buffers of other library calls that it reads: gradients,
  and the forward values it reads where they are recomputed (saved ones are in the arena).
- Every plan, asked only where the bounds above do not settle a pick (backward_floor, Scored.exceeds): at the step of
  a backward library call, a storage read by the call or by a backward node computed from its outputs is still live
  if it is saved (read from its forward copy; with contiguous=True, in the arena), or if the call is computed from it
  and inductor writes it out — a recomputed value or a gradient that a library call makes or reads (with
  contiguous=True only one a library call makes: a loop may write into the arena). It then exists before the call
  and is read after it, in every order a module may run in. A plan that saves little recomputes most of its forward
  ahead of the first backward matmul, and those values wait for the weight gradients: its peak is far above its
  saved bytes, and this bound sees much of it.

Pure functions of the graph facts and the plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.table import arena_slot_bytes
from .arrays import BACKWARD, FORWARD
from .fusion import OPAQUE
from .transfer import packed

if TYPE_CHECKING:
    from .problem import Problem, Resolved


FEW_BITS = 24  # up to this many storages, _bytes adds them one by one; more, it masks the sizes


@dataclasses.dataclass(frozen=True)
class Call:
    """A backward library call, as the arena floor counts it."""

    live: int  # bytes live at its step in every plan: its outputs, its scratch, the gradients it reads
    recomputed: tuple[int, ...]  # forward storages it reads that library calls make: live when recomputed


@dataclasses.dataclass(frozen=True)
class Later:
    """A backward library call, as the backward floor counts it."""

    position: int
    live: int  # bytes live at its step in every plan (later_calls)
    # the same, counting of the gradients only library calls' outputs: with contiguous=True a loop may write its
    # output into the arena slot of a packed value it reads last (inplace.in_place), and the arena is counted whole
    arena_live: int
    reads: int  # bit (forward_bits) per forward storage it or a backward node computed from its outputs reads
    most: int  # live plus the bytes of every storage of `reads`: what the floor at its step can reach


def saved_floor(problem: Problem, resolved: Resolved, saved_at: Iterable[int] | None = None) -> int:
    """The bytes of the saved storages the device keeps (every one is live as the forward ends). Those that leave
    the device and the gradients the step returns are left out. `saved_at`: the positions of the saved values,
    where known (no name is then looked up)."""
    a = problem.arrays
    leaving = resolved.sharded | resolved.offloaded
    if saved_at is None or leaving:
        kept = resolved.saved - leaving if leaving else resolved.saved
        saved_at = map(a.index.__getitem__, kept)
    owners = set(map(a.storage.__getitem__, saved_at))
    return sum(map(problem.counted_bytes.__getitem__, owners))


def counted_bytes(problem: Problem) -> tuple[int, ...]:
    """Per position: its bytes where the simulation counts it as a storage (_counted), else 0."""
    nbytes = problem.arrays.nbytes
    return tuple(size if _counted(problem, o) else 0 for o, size in enumerate(nbytes))


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


def floor(problem: Problem, resolved: Resolved, saved_at: Iterable[int] | None = None) -> int:
    """The best lower bound on the plan's simulated peak this module finds (`saved_at`: as saved_floor's)."""
    found = saved_floor(problem, resolved, saved_at)
    if problem.transfer.contiguous:
        found = max(found, arena_floor(problem, resolved))
    return found


def arena_floor(problem: Problem, resolved: Resolved) -> int:
    """contiguous=True: the arena's bytes plus the most any backward library call needs live at its step
    (Problem.library_calls), as the simulation counts them."""
    a = problem.arrays
    nbytes = a.nbytes
    arena = _arena_bytes(problem, resolved)
    recomputed = {a.index[name] for name in resolved.recomputed}
    needs = (call.live + sum(nbytes[o] for o in call.recomputed if o in recomputed) for call in problem.library_calls)
    return arena + max(needs, default=0)


def _arena_bytes(problem: Problem, resolved: Resolved) -> int:
    """contiguous=True: the bytes of the arena's slots (the saved values it packs)."""
    a = problem.arrays
    stored = packed(problem.graph, resolved.saved, resolved.moves)
    return sum(arena_slot_bytes(a.nbytes[a.index[name]]) for name in stored)


def library_calls(problem: Problem) -> tuple[Call, ...]:
    """The backward library calls of the graph (each distinct Call once): the backward nodes every plan runs that
    are opaque ops, not views, and not an mm that inductor may compute inside an addmm."""
    return tuple(dict.fromkeys(_call(problem, i) for i in _library_positions(problem)))


def _library_positions(problem: Problem) -> list[int]:
    """The backward nodes every plan runs that are library calls: opaque ops, not views, and not an mm that
    inductor may compute inside an addmm."""
    a = problem.arrays
    role, kinds = a.role, a.kinds
    return [
        i
        for i in problem.backward_positions
        if role[i] == BACKWARD and kinds[i] == OPAQUE and not a.is_view[i] and a.folds[i] < 0
    ]


def _outputs(problem: Problem, i: int) -> dict[int, int]:
    """The counted storages library call `i` allocates, with their bytes."""
    a = problem.arrays
    return {m: a.nbytes[m] for m in (i, *a.getitems[i]) if a.role[m] == BACKWARD and _counted(problem, m)}


def _scratch(problem: Problem, i: int) -> int:
    a = problem.arrays
    return a.nbytes[a.workspace[i]] if a.workspace[i] >= 0 else 0


def _call(problem: Problem, i: int) -> Call:
    a = problem.arrays
    role, storage, nbytes, kinds = a.role, a.storage, a.nbytes, a.kinds
    live = _outputs(problem, i)
    recomputed: list[int] = []
    for j in a.distinct[i]:
        o = storage[j]
        if o in live or kinds[o] != OPAQUE or not _counted(problem, o):
            continue
        if role[o] == BACKWARD:
            live[o] = nbytes[o]
        elif role[o] == FORWARD and o not in recomputed:
            recomputed.append(o)
    return Call(sum(live.values()) + _scratch(problem, i), tuple(recomputed))


def forward_bits(problem: Problem) -> list[int]:
    """Per position, the bit of a forward storage in the backward floor's sets, -1 for any other position. The bits
    number the forward storages alone, in graph order: a set of them is a Python integer as long as its highest bit,
    so a set of early storages stays short."""
    a = problem.arrays
    role, storage = a.role, a.storage
    bit = [-1] * len(a.names)
    b = 0
    for i in range(len(a.names)):
        if role[i] == FORWARD and storage[i] == i:
            bit[i] = b
            b += 1
    return bit


def forward_sizes(problem: Problem) -> np.ndarray:
    """The bytes of each forward storage, by its bit (forward_bits)."""
    nbytes = problem.arrays.nbytes
    return np.array([nbytes[i] for i, b in enumerate(problem.forward_bits) if b >= 0], dtype=np.int64)


def later_calls(problem: Problem) -> tuple[Later, ...]:
    """The backward library calls (as library_calls) with what is live at each in every plan — its outputs, its
    scratch, and the gradients written out that it is computed from and that it or a backward node computed from its
    outputs reads — and the forward storages read at or after it (backward_floor), the one that may need the most
    first."""
    a = problem.arrays
    role, storage, distinct = a.role, a.storage, a.distinct
    bit, sizes = problem.forward_bits, problem.forward_sizes
    backward = [i for i in problem.backward_positions if role[i] == BACKWARD]
    none = bytearray(len(a.names))
    written = [  # gradients every plan writes out: library calls' outputs, and values a library call reads
        o
        for o in sorted(set(storage[i] for i in backward))
        if role[o] == BACKWARD
        and _counted(problem, o)
        and ((a.kinds[o] == OPAQUE and a.folds[o] < 0) or _call_reads(a, o, none))
    ]
    grad_bit = {o: b for b, o in enumerate(written)}  # their bits, numbered apart from the forward storages'
    grad_sizes = np.array([a.nbytes[o] for o in written], dtype=np.int64)
    opaque = 0  # the library calls' outputs among them
    for o in written:
        if a.kinds[o] == OPAQUE:
            opaque |= 1 << grad_bit[o]
    # per backward node: bit per forward storage, and per gradient written out, that it or a node computed from it
    # reads
    after_fw: dict[int, int] = {}
    after_grad: dict[int, int] = {}
    for i in reversed(backward):
        fw_bits, grad_bits = 0, 0
        for j in distinct[i]:
            o = storage[j]
            if bit[o] >= 0:
                fw_bits |= 1 << bit[o]
            elif o in grad_bit:
                grad_bits |= 1 << grad_bit[o]
        for u in a.users[i]:
            fw_bits |= after_fw.get(u, 0)
            grad_bits |= after_grad.get(u, 0)
        after_fw[i], after_grad[i] = fw_bits, grad_bits
    before: dict[int, int] = {}  # per backward node: bit per gradient written out it is computed from
    for i in backward:
        bits = 0
        for j in distinct[i]:
            if j in before:
                bits |= before[j]
                if storage[j] in grad_bit:
                    bits |= 1 << grad_bit[storage[j]]
        before[i] = bits
    calls = []
    for i in _library_positions(problem):
        own = sum(_outputs(problem, i).values()) + _scratch(problem, i)
        held = before[i] & after_grad[i]
        live = own + _bytes(held, grad_sizes)
        arena_live = own + _bytes(held & opaque, grad_sizes)
        reads = after_fw[i]
        calls.append(Later(i, live, arena_live, reads, live + _bytes(reads, sizes)))
    return tuple(sorted(calls, key=lambda call: (-call.most, call.position)))


def backward_floor(problem: Problem, resolved: Resolved, above: int = -1) -> int:
    """The most live, over the backward library calls, at a call's step (module docstring): its own needs
    (Later.live), the saved storages the device keeps (contiguous=True: the arena instead) read then or later, and
    the recomputed values written out that it is computed from, read then or later. The largest such sum, or, once a
    sum exceeds `above`, that sum (first tried: the largest of the calls' own needs, which every plan has). Sets of
    forward storages are integers over forward_bits (Later.reads)."""
    a = problem.arrays
    calls = problem.later_calls
    if not calls:
        return 0
    arena = problem.transfer.contiguous
    base = _arena_bytes(problem, resolved) if arena else 0  # the saved values are in the arena's slots
    if above >= 0:
        # what every plan has live at some call's step settles a low limit (a least-peak search asks for 0 bytes)
        # before the plan's own sets are walked
        live, arena_live = problem.graph_fact("largest call needs", _largest_needs)
        found = base + (arena_live if arena else live)
        if found > above:
            return found
    storage, kinds, distinct = a.storage, a.kinds, a.distinct
    bit, sizes = problem.forward_bits, problem.forward_sizes
    index = a.index
    loops = not arena  # whether a loop's output counts: none may be written into the arena (Later.arena_live)
    recomputed = sorted(index[n] for n in resolved.recomputed)
    is_recomputed = bytearray(len(a.names))
    for i in recomputed:
        is_recomputed[i] = 1
    made: dict[int, int] = {}  # per recomputed or backward node: bit per recomputed library call's storage it needs
    for i in recomputed:  # in graph order: what a node reads comes first
        bits = 0
        for j in distinct[i]:
            if is_recomputed[j] and made[j]:
                bits = bits | made[j] if bits else made[j]
        if (
            bit[i] >= 0
            and _counted(problem, i)
            and (kinds[i] == OPAQUE or (loops and _call_reads(a, i, is_recomputed)))
        ):
            bits |= 1 << bit[i]
        made[i] = bits
    for i in problem.backward_positions:
        bits = 0
        for j in distinct[i]:
            more = made.get(j)
            if more:
                bits = bits | more if bits else more  # the first shared, not copied: a chain's are long
        made[i] = bits
    kept = 0  # saved storages counted one by one (only forward ones meet Later.reads)
    if not arena:
        leaving = resolved.sharded | resolved.offloaded
        for name in resolved.saved:
            if name not in leaving:
                o = storage[index[name]]
                if bit[o] >= 0 and _counted(problem, o):
                    kept |= 1 << bit[o]
    best = 0
    for call in calls:
        if base + call.most <= best:
            break  # sorted by `most`: no later call can need more
        found = (
            base + (call.arena_live if arena else call.live) + _bytes(call.reads & (kept | made[call.position]), sizes)
        )
        if found > best:
            best = found
            if best > above >= 0:
                break
    return best


def _largest_needs(problem: Problem) -> tuple[int, int]:
    """The most any backward library call needs live at its step in every plan: (Later.live, Later.arena_live)."""
    calls = problem.later_calls
    return max(call.live for call in calls), max(call.arena_live for call in calls)


def _call_reads(a, i: int, is_recomputed: bytearray) -> bool:
    """Whether a library call of the backward module (a backward node or a recomputed one) reads storage `i`,
    itself or through a view: inductor then writes it out (fusion.inlined computes a value inside its readers only
    where all are loops)."""
    for u in a.users[i]:
        if a.role[u] != BACKWARD and not is_recomputed[u]:
            continue
        if a.is_view[u]:
            if _call_reads(a, u, is_recomputed):
                return True
        elif a.kinds[u] == OPAQUE:
            return True
    return False


def _bytes(bits: int, sizes: np.ndarray) -> int:
    """The bytes of the storages whose bits are set (`sizes`: the bytes per bit)."""
    if bits.bit_count() <= FEW_BITS:
        total = 0
        while bits:
            low = bits & -bits
            total += int(sizes[low.bit_length() - 1])
            bits ^= low
        return total
    raw = np.frombuffer(bits.to_bytes((bits.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    mask = np.unpackbits(raw, bitorder="little")
    return int(np.dot(mask[: len(sizes)], sizes[: len(mask)]))
