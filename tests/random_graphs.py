"""Seeded random differentiable models, for property tests of the planner.

`random_model(seed, size)` draws a small program — chains of pointwise ops, matmuls with parameters, diamonds,
residual adds, reductions broadcast back, views (transpose, reshape, slices) and broadcast bias adds — over a pool of
live tensors, and wraps it in an nn.Module whose forward interprets it and returns a scalar loss. The program is
plain data drawn from `random.Random(seed)` and the weights from a seeded `torch.Generator`, so the same seed gives
the same joint graph. Every tensor is at most 256×256 fp32, so planning one model takes milliseconds.
`kinds=FUZZ_KINDS` adds random ops (dropout), in-place ops on activations, multi-output ops (layer_norm), softmax,
max-reductions broadcast both ways, non-contiguous reshapes, chunks joined back, expanded slices and rolls.

`synthetic_chain(n_layers)` is a deep residual MLP (Linear → GELU → LayerNorm → residual add per layer) whose joint
graph grows linearly with depth: 26 nodes per layer, 10,017 nodes at 385 layers.
"""

from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

POINTWISE = ("sin", "cos", "tanh", "exp", "relu", "gelu", "sigmoid")
JOINS = ("add", "mul")
KINDS = ("chain", "matmul", "diamond", "residual", "reduce", "transpose", "reshape", "slice", "bias")
EXTRA_KINDS = ("dropout", "inplace", "layernorm", "softmax", "broadcast", "permute", "chunk", "expand", "roll")
FUZZ_KINDS = KINDS + EXTRA_KINDS
INPLACE = ("tanh_", "sigmoid_", "relu_")
WIDTHS = (64, 128)
BATCHES = (32, 64, 128, 256)


def pointwise(name: str, t: torch.Tensor) -> torch.Tensor:
    if name == "sin":
        return torch.sin(t)
    if name == "cos":
        return torch.cos(t)
    if name == "tanh":
        return torch.tanh(t)
    if name == "exp":
        return torch.exp(0.1 * t)  # scaled so that chains of exps stay finite
    if name == "relu":
        return torch.relu(t)
    if name == "gelu":
        return F.gelu(t)
    if name == "sigmoid":
        return torch.sigmoid(t)
    raise ValueError(f"unknown pointwise op {name!r}; expected one of {POINTWISE}")


def join(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b if name == "add" else a * b


class RandomModel(nn.Module):
    """Interprets `program`: a tuple of steps, each (kind, input pool indices, op names, parameter name or "")
    appending one tensor of shape (batch, width) to the pool. The loss sums the mean square of every pool tensor no
    later step reads, so every step reaches the loss."""

    def __init__(self, program: tuple, batch: int, width: int, params: dict[str, torch.Tensor]):
        super().__init__()
        self.program = program
        self.batch, self.width = batch, width
        for name, value in params.items():
            self.register_parameter(name, nn.Parameter(value))
        read = {i for _, inputs, _, _ in program for i in inputs}
        self.outputs = tuple(i for i in range(len(program) + 1) if i not in read)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = [x]
        for kind, inputs, ops, param in self.program:
            pool.append(self.step(kind, [pool[i] for i in inputs], ops, param))
        return sum((pool[i].square().mean() for i in self.outputs), torch.zeros(()))

    def step(self, kind: str, args: list[torch.Tensor], ops: tuple[str, ...], param: str) -> torch.Tensor:
        t = args[0]
        if kind == "chain":
            for op in ops:
                t = pointwise(op, t)
            return t
        if kind == "matmul":
            return pointwise(ops[0], t @ getattr(self, param))
        if kind == "diamond":
            return join(ops[2], pointwise(ops[0], t), pointwise(ops[1], t))
        if kind == "residual":
            return join(ops[0], t, args[1])
        if kind == "reduce":  # sum over a dim, broadcast back
            dim = int(ops[1])
            return pointwise(ops[0], t) * torch.sigmoid(t.sum(dim=dim, keepdim=True) / t.shape[dim])
        if kind == "transpose":  # (B, W)ᵀ @ (B, B) → transposed back: two views around a matmul
            return pointwise(ops[0], (t.t() @ getattr(self, param)).t())
        if kind == "reshape":
            return pointwise(ops[0], t.reshape(-1, self.width // 2)).reshape(self.batch, self.width)
        if kind == "slice":
            half = self.width // 2
            return torch.cat([pointwise(ops[0], t[:, :half]), pointwise(ops[1], t[:, half:])], dim=1)
        if kind == "bias":
            return pointwise(ops[0], t + getattr(self, param))
        return self.extra_step(kind, args, ops)

    def extra_step(self, kind: str, args: list[torch.Tensor], ops: tuple[str, ...]) -> torch.Tensor:
        t = args[0]
        if kind == "dropout":
            return F.dropout(pointwise(ops[0], t), p=float(ops[1]), training=True)
        if kind == "inplace":  # an activation overwritten in place (its own backward reads the result)
            u = t * 1.5
            getattr(u, ops[0])()
            return u
        if kind == "layernorm":  # a multi-output op: output, mean, rstd
            return pointwise(ops[0], F.layer_norm(t, (self.width,)))
        if kind == "softmax":
            dim = int(ops[1])
            return pointwise(ops[0], t.softmax(dim=dim) * t.shape[dim])
        if kind == "broadcast":  # (1, W) and (B, 1) reductions broadcast back over (B, W)
            return pointwise(ops[0], t * t.mean(dim=0, keepdim=True) + t.amax(dim=1, keepdim=True))
        if kind == "permute":  # a reshape of a non-contiguous view copies
            half = self.width // 2
            return pointwise(ops[0], t.view(self.batch, 2, half).transpose(1, 2).reshape(self.batch, self.width))
        if kind == "chunk":  # four views of one tensor, joined back
            a, b, c, d = t.chunk(4, dim=1)
            return torch.cat([pointwise(ops[0], a), b * c, pointwise(ops[1], d), a + d], dim=1)
        if kind == "expand":
            return t[:, :1].expand(-1, self.width) * pointwise(ops[0], t)
        if kind == "roll":
            return pointwise(ops[0], torch.roll(t, shifts=int(ops[1]), dims=1)) + t
        raise ValueError(f"unknown step kind {kind!r}; expected one of {FUZZ_KINDS}")


def random_model(
    seed: int, size: int = 12, kinds: tuple[str, ...] = KINDS
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A random model of `size` steps drawn from `kinds`, and its input, both determined by `seed`."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    width, batch = rng.choice(WIDTHS), rng.choice(BATCHES)
    params: dict[str, torch.Tensor] = {}

    def param(shape: tuple[int, ...]) -> str:
        name = f"p{len(params)}"
        params[name] = torch.randn(*shape, generator=gen) / shape[0] ** 0.5
        return name

    def pick(pool_size: int) -> int:
        # Favour recent tensors (long chains) while still reaching back (long-lived activations).
        return max(rng.randrange(pool_size) for _ in range(2))

    ops = lambda k: tuple(rng.choice(POINTWISE) for _ in range(k))  # noqa: E731
    program = []
    for step in range(size):
        pool_size = step + 1
        kind = rng.choice(kinds)
        inputs: tuple[int, ...] = (pick(pool_size),)
        name = ""
        if kind == "chain":
            names = ops(rng.randint(1, 3))
        elif kind == "matmul":
            names, name = ops(1), param((width, width))
        elif kind == "diamond":
            names = ops(2) + (rng.choice(JOINS),)
        elif kind == "residual":
            inputs += (rng.randrange(pool_size),)
            names = (rng.choice(JOINS),)
        elif kind == "reduce":
            names = ops(1) + (str(rng.randrange(2)),)
        elif kind == "transpose":
            names, name = ops(1), param((batch, batch))
        elif kind == "bias":
            names, name = ops(1), param((width,))
        elif kind == "dropout":
            names = ops(1) + (rng.choice(("0.1", "0.5")),)
        elif kind == "inplace":
            names = (rng.choice(INPLACE),)
        elif kind == "softmax":
            names = ops(1) + (str(rng.randrange(2)),)
        elif kind == "roll":
            names = ops(1) + (str(rng.randrange(1, width)),)
        else:
            names = ops(2)
        program.append((kind, inputs, names, name))
    x = torch.randn(batch, width, generator=gen)
    return RandomModel(tuple(program), batch, width, params), (x,)


class ChainLayer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(F.gelu(self.linear(x)))


class Chain(nn.Module):
    def __init__(self, n_layers: int, width: int):
        super().__init__()
        self.layers = nn.Sequential(*(ChainLayer(width) for _ in range(n_layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).square().mean()


def synthetic_chain(n_layers: int, width: int = 64, batch: int = 16) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A deep residual MLP and its input; its joint graph has 26 nodes per layer plus a few (385 layers: 10,017)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Chain(n_layers, width)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    return model, (x,)
