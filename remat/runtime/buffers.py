"""Arenas for contiguous checkpointing: the saved values of one step live at fixed offsets of one buffer.

The pool hands a step a buffer no saved value of an earlier step still uses, and allocates a new one only when
every large enough buffer is in use (a second forward before the first backward, gradient accumulation) or the
shapes grew. After a graph's first step its saved values allocate nothing: each is copied into its slot, and the
allocator does not fragment around long-lived activations.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from .table import arena_slot_bytes


@dataclasses.dataclass
class PoolStats:
    allocations: int = 0  # buffers allocated, ever
    reuses: int = 0  # steps served by a buffer allocated earlier


@dataclasses.dataclass
class Watch:
    """What a block took from the pool (ArenaPool.watch): `held`, the buffers there when it began (referenced, so no
    buffer made later takes one's id), and `taken`, those of them a step took within it: {id: (device, bytes)}."""

    held: dict[int, torch.Tensor]
    taken: dict[int, tuple[torch.device, int]] = dataclasses.field(default_factory=dict)

    def bytes_on(self, device: torch.device) -> int:
        """Bytes of the taken buffers on `device` (any index of its type when it names none)."""
        return sum(n for d, n in self.taken.values() if d.type == device.type and device.index in (None, d.index))


class ArenaPool:
    """Buffers per device, handed to the steps of compiled graphs. A graph's step places its saved values one
    after another (offsets follow the order the compiled code stores them); the arena size a graph needs is learned
    from its first step (whose values get plain allocations) and grown when its shapes grow."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, list[torch.Tensor]] = {}
        self._open: dict[tuple[int, torch.device], list] = {}  # (graph, device) → [buffer, next offset, placed, total]
        self._need: dict[tuple[int, torch.device], int] = {}  # (graph, device) → bytes its largest step placed
        self.stats = PoolStats()
        self._watches: list[Watch] = []

    @contextlib.contextmanager
    def watch(self) -> Iterator[Watch]:
        """Within the block, record the buffers allocated before it that steps take from the pool. A measurement of
        the block counts them: the pool kept them between steps, but they hold the block's saved values (a buffer
        allocated within the block is an allocation of its own)."""
        watch = Watch({id(b): b for held in self._buffers.values() for b in held})
        self._watches.append(watch)
        try:
            yield watch
        finally:
            self._watches = [w for w in self._watches if w is not watch]

    def place(self, key: int, device: torch.device, nbytes: int, num_slots: int) -> tuple[torch.Tensor, int] | None:
        """(buffer, byte offset) for the next saved value of graph `key`'s current step, or None when the arena
        cannot hold it (the first step, or shapes that grew): the value then keeps its own allocation."""
        slot = (key, device)
        entry = self._open.get(slot)
        if entry is None:
            need = self._need.get(slot)
            entry = self._open[slot] = [self._acquire(device, need) if need else None, 0, 0, 0]
        size = arena_slot_bytes(nbytes)
        buffer, offset = entry[0], entry[1]
        placed = None
        if buffer is not None and offset + size <= buffer.numel():
            placed = (buffer, offset)
            entry[1] += size
        entry[2] += 1
        entry[3] += size
        if entry[2] >= num_slots:
            self._need[slot] = max(self._need.get(slot, 0), entry[3])
            del self._open[slot]
        return placed

    def _acquire(self, device: torch.device, nbytes: int) -> torch.Tensor:
        free = [b for b in self._buffers.setdefault(device, []) if b.numel() >= nbytes and not _in_use(b)]
        if free:
            self.stats.reuses += 1
            buffer = min(free, key=lambda b: b.numel())
            for watch in self._watches:
                if id(buffer) in watch.held:
                    watch.taken[id(buffer)] = (buffer.device, buffer.numel())
            return buffer
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self._buffers[device].append(buffer)
        self.stats.allocations += 1
        return buffer

    def reserve(self, key: int, device: torch.device, nbytes: int, count: int = 0) -> None:
        """Tell the pool that graph `key`'s steps place `nbytes` on `device` (so its first step already uses an
        arena), and allocate up front so that at least `count` buffers that large exist (a known number of steps
        alive at once: one allocation each, before the steps fragment the allocator)."""
        slot = (key, device)
        self._need[slot] = max(self._need.get(slot, 0), nbytes)
        have = [b for b in self._buffers.setdefault(device, []) if b.numel() >= nbytes]
        for _ in range(count - len(have)):
            self._buffers[device].append(torch.empty(nbytes, dtype=torch.uint8, device=device))
            self.stats.allocations += 1

    def trim(self) -> int:
        """Drop every buffer no saved view uses (their memory goes back to the allocator); buffers in use stay.
        Returns the number dropped."""
        dropped = 0
        for device, held in self._buffers.items():
            keep = [b for b in held if _in_use(b)]
            dropped += len(held) - len(keep)
            self._buffers[device] = keep
        return dropped

    def clear(self) -> None:
        self._buffers.clear()
        self._open.clear()
        self._need.clear()
        self.stats = PoolStats()


def _in_use(buffer: torch.Tensor) -> bool:
    # The pool holds one reference to the storage; every saved view placed in it holds another.
    from .. import _torch

    return _torch.storage_use_count(buffer) > 1


POOL = ArenaPool()
