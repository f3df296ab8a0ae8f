"""Per-step records of what remat's checkpoint ops did: time and bytes in recompute, offload, reload, shard, gather
and pack.

A compiled graph with ``profile=True`` owns one `Profile`; its ops find it by id. A step starts when the forward
runs its first checkpoint op; `Profile.steps` keeps one `StepRecord` per step (the most recent 1000).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import weakref

import torch

from ..units import fmt_bytes, render_table
from .table import PROFILE_KEYS

KINDS = PROFILE_KEYS  # recompute, then the keys of the checkpoint ops (table.py)


@dataclasses.dataclass
class StepRecord:
    """Seconds and bytes per kind of checkpoint work in one step."""

    seconds: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    bytes: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    calls: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))


class Profile:
    """What the checkpoint ops of one compiled graph did, step by step."""

    def __init__(self) -> None:
        self.id = next(_ids)
        self.steps: list[StepRecord] = []
        self._open: dict[str, float] = {}
        _live[self.id] = self

    def new_step(self) -> None:
        self.steps.append(StepRecord())
        del self.steps[:-1000]

    def add(self, kind: str, seconds: float, nbytes: int) -> None:
        if not self.steps:
            self.new_step()
        step = self.steps[-1]
        step.seconds[kind] += seconds
        step.bytes[kind] += nbytes
        step.calls[kind] += 1

    def begin(self, label: str) -> None:
        self._open[label] = time.perf_counter()

    def end(self, label: str, kind: str, nbytes: int) -> None:
        start = self._open.pop(label, None)
        if start is not None:
            self.add(kind, time.perf_counter() - start, nbytes)

    def totals(self) -> StepRecord:
        """Sums over all recorded steps."""
        total = StepRecord()
        for step in self.steps:
            for kind in KINDS:
                total.seconds[kind] += step.seconds[kind]
                total.bytes[kind] += step.bytes[kind]
                total.calls[kind] += step.calls[kind]
        return total

    def table(self) -> str:
        """The totals over the recorded steps, one row per kind: calls, seconds and bytes."""
        if not self.steps:
            return "Profile: no step recorded yet"
        total = self.totals()
        steps = len(self.steps)
        rows = [("kind", "calls", "seconds", "bytes")]
        rows += [
            (kind, str(total.calls[kind]), f"{total.seconds[kind]:.6f}", fmt_bytes(total.bytes[kind])) for kind in KINDS
        ]
        lines = [f"Profile: totals over {steps} step{'s' if steps != 1 else ''}"]
        return "\n".join(lines + render_table(rows, right_align=True))

    def __repr__(self) -> str:
        return self.table()


_ids = itertools.count()
_live: "weakref.WeakValueDictionary[int, Profile]" = weakref.WeakValueDictionary()


def lookup(profile_id: int) -> Profile | None:
    return _live.get(profile_id) if profile_id >= 0 else None


def synchronize(device: torch.device) -> None:
    """Wait for the device, as DeepSpeed's `synchronize` does around checkpoint work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
