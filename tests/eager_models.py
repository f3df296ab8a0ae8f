"""Small models and helpers shared by the eager checkpointing tests."""

from __future__ import annotations

import contextlib
import copy
import gc

import torch
from torch import nn

from remat.eager import region


class TwoInThreeOut(nn.Module):
    """Two inputs, three outputs returned out of computation order; an optional mask (bool or float)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x, y, mask=None):
        h = torch.tanh(self.a(x))
        g = torch.sigmoid(self.b(y))
        if mask is not None:
            h = h.masked_fill(~mask, 0.0) if mask.dtype == torch.bool else h * mask
        return g * h, h.exp(), (h + g).relu()


class Counted(nn.Module):
    """A Linear + tanh that counts its forward calls."""

    def __init__(self, width: int = 8, log: list | None = None, index: int = 0):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.calls = 0
        self.log = log
        self.index = index

    def forward(self, x):
        self.calls += 1
        if self.log is not None:
            self.log.append(self.index)
        return torch.tanh(self.lin(x))


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and len(a) > 0
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"tensor {i} differs: max |diff| {(x - y).abs().max().item()}"


def twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def recompute_log(monkeypatch, children_log: list | None = None) -> list[list]:
    """Record each region recomputation: the list gets one entry per recomputation, the children (by the indices
    they append to `children_log`) that ran inside it."""
    runs: list[list] = []
    original = region.Region.recompute

    def counted(self):
        start = len(children_log) if children_log is not None else 0
        original(self)
        runs.append(list(children_log[start:]) if children_log is not None else [])

    monkeypatch.setattr(region.Region, "recompute", counted)
    return runs


@contextlib.contextmanager
def fresh_checkpointing_state():
    """remat.checkpointing unconfigured, an empty RNG tracker and no idle arenas for the duration, restored after
    (regions of earlier tests, kept alive by tracebacks, are collected first so they do not count)."""
    from remat.eager import checkpointing as impl
    from remat.runtime import buffers, rng

    gc.collect()
    saved = (impl._settings, impl._profile, impl._reserve, impl._configured)
    impl._settings, impl._profile, impl._reserve, impl._configured = None, None, None, False
    rng.TRACKER.reset()
    buffers.POOL.trim()
    try:
        yield
    finally:
        impl._settings, impl._profile, impl._reserve, impl._configured = saved
        rng.TRACKER.reset()
        buffers.POOL.trim()
