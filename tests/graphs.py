"""Small models with exact sizes: 512×512 fp32 tensors are 1 MiB, a 512³ matmul is 2·512³ flops."""

from __future__ import annotations

import torch
import torch.nn as nn

from remat.units import MIB  # noqa: F401  (the tests import it from here with the graphs)

N = 512


class CosMM(nn.Module):
    """cos → depth × (mm 512² → cos): backward reads every mm output (for cos) and every mm input (for mm)."""

    def __init__(self, depth: int = 5):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(N, N, generator=gen) / N**0.5) for _ in range(depth))

    def forward(self, x):
        x = torch.cos(x)
        for w in self.weights:
            x = torch.cos(torch.mm(x, w))
        return x.sum()


def cosmm_input() -> torch.Tensor:
    return torch.randn(N, N, generator=torch.Generator().manual_seed(1))
