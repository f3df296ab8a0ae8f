"""Code the notebooks in this folder share (and partition_worker.py): a model with its loss as one module, one
training step from a fixed seed, and gradients compared bit for bit.

Import it before torch: it sets the log levels of torch's CPU profiler (remat.peak_memory reads it), whose C++ side
logs a line at every start and stop, and those are read when torch is imported.
"""

from __future__ import annotations

import os

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # keep the CPU profiler's start/stop log lines out of the outputs
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

# torch 2.13's pytree deprecation, raised when a compiled graph's input/output specs are deep-copied
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

MIB = 2**20


class LossStep(torch.nn.Module):
    """`loss_fn(model, *inputs)` as one module, so that torch.compile plans the loss's activations with the model's."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs: Any) -> torch.Tensor:
        return self.loss_fn(self.model, *inputs)


def mean_square(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A scalar loss for a model without one: the mean of its squared output."""
    return model(x).square().mean()


def gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter's gradient, by parameter name; a compiled module's "_orig_mod." prefix is dropped so
    its names match the uncompiled module's."""
    named = module.named_parameters()
    return {name.removeprefix("_orig_mod."): p.grad.clone() for name, p in named if p.grad is not None}


def train_step(
    module: torch.nn.Module, *inputs: Any, loss_fn: Callable[..., torch.Tensor] | None = None, seed: int = 0
) -> torch.Tensor:
    """One forward and backward of `module(*inputs)` (a scalar loss), or of `loss_fn(module, *inputs)`, from a fixed
    RNG seed, so that random ops (dropout) draw the same numbers every time; gradients start from None. Returns the
    loss; the gradients stay on the parameters (`gradients` copies them), so a measured step allocates nothing else."""
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(*inputs) if loss_fn is None else loss_fn(module, *inputs)
    loss.backward()
    return loss.detach()


def mismatched(grads: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> list[str]:
    """The names whose gradient is not bitwise equal (`torch.equal`) to the reference's, or missing."""
    return [name for name, g in reference.items() if name not in grads or not torch.equal(grads[name], g)]
