"""Arenas for contiguous checkpointing: the saved values of one step live at fixed offsets of one buffer.

A compiled graph asks for an arena of a given size on a device; the pool hands out a buffer no saved value of an
earlier step still uses, and allocates a new one only when every buffer of that size is in use (a second forward
before the first backward, or gradient accumulation). So after the first step no saved value allocates: each is
copied into its slot, and the allocator does not fragment around long-lived activations.
"""
from __future__ import annotations

import dataclasses

import torch

ALIGN = 64  # bytes; every slot starts at a multiple of this


@dataclasses.dataclass
class PoolStats:
    allocations: int = 0  # buffers allocated, ever
    reuses: int = 0  # steps served by a buffer allocated earlier


class ArenaPool:
    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, int], list[torch.Tensor]] = {}
        self._open: dict[tuple[int, torch.device], list] = {}  # (graph, device) → [buffer, slots placed]
        self.stats = PoolStats()

    def place(self, key: int, device: torch.device, nbytes: int, num_slots: int) -> torch.Tensor:
        """The buffer the current step of graph `key` places its saved values in. The first value of a step
        acquires one; the step ends when all `num_slots` values are placed (in whatever order the compiler ran
        the stores)."""
        entry = self._open.get((key, device))
        if entry is None:
            entry = self._open[(key, device)] = [self._acquire(device, nbytes), 0]
        entry[1] += 1
        if entry[1] >= num_slots:
            del self._open[(key, device)]
        return entry[0]

    def _acquire(self, device: torch.device, nbytes: int) -> torch.Tensor:
        slot = (device, nbytes)
        for buffer in self._buffers.setdefault(slot, []):
            if not _in_use(buffer):
                self.stats.reuses += 1
                break
        else:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self._buffers[slot].append(buffer)
            self.stats.allocations += 1
        return buffer

    def reserve(self, device: torch.device, nbytes: int, count: int) -> None:
        """Allocate up front so that at least `count` buffers of `nbytes` exist on `device` (a known number of
        checkpoints per step: one contiguous allocation each, before the step fragments the allocator)."""
        have = self._buffers.setdefault((device, nbytes), [])
        for _ in range(count - len(have)):
            have.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
            self.stats.allocations += 1

    def trim(self, key: int | None = None) -> int:
        """Drop every buffer no saved view uses (their memory goes back to the allocator) and forget the open step
        of graph `key` (all open steps when None). Buffers still in use stay. Returns the number dropped."""
        dropped = 0
        for slot, held in self._buffers.items():
            keep = [b for b in held if _in_use(b)]
            dropped += len(held) - len(keep)
            self._buffers[slot] = keep
        for open_key in [k for k in self._open if key is None or k[0] == key]:
            del self._open[open_key]
        return dropped

    def buffers(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
        self._open.clear()
        self.stats = PoolStats()


def _in_use(buffer: torch.Tensor) -> bool:
    # The pool holds one reference to the storage; every saved view placed in it holds another.
    from .. import _torch

    return _torch.storage_use_count(buffer) > 1


def slot_offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Byte offsets of values that are all live together (saved values at the forward/backward boundary), aligned,
    and the arena size."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    return offsets, end


POOL = ArenaPool()
