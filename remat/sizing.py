"""The largest batch that fits a byte budget: `remat.max_batch(model, make_inputs, memory_budget)`.

The training step is traced once with a dynamic batch dimension and planned once, at one batch size: the hint. A
plan is a set of decisions — save this activation, recompute that one — and those decisions remain a valid plan at
every batch size; only the bytes change. So the plan's peak is a sympy expression in the batch symbol
(`remat.plan.symbolic.symbolic_memory`), and the search for the largest batch runs on that expression, without
tracing or running anything per candidate.

The answer is therefore "the largest batch at which *this plan* fits", the plan being the one the budget led to at
the hint. Where the budget does not bind at the hint, that is the plan that recomputes least (often the baseline); a
planner run at a larger batch would recompute more and might fit more. Pass `hint=` a batch near the one you mean
to train with to plan at a realistic size.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from typing import Any, Callable, Literal, Sequence

import sympy
import torch

from . import _torch, scoped
from .config import RematConfig, parse_bytes
from .explain import capture_joints
from .measure import warm_training_peak
from .pipeline import plan_joint
from .plan.plan import Plan
from .plan.symbolic import symbolic_memory

__all__ = ["BatchFit", "max_batch"]


@dataclasses.dataclass(frozen=True)
class BatchFit:
    """What `max_batch` found. Bytes are activation bytes as docs/design.md counts them (parameters, their gradients
    and the inputs left out)."""

    batch: int  # the largest batch in [start, limit] whose predicted peak is within the budget
    predicted_peak: int  # the plan's peak at `batch`, from `expr`
    predicted_next: int  # the plan's peak at `batch + 1`, from `expr`
    # Measured peak of one training step at `batch` (at `batch + 1`), run through remat compiled at `hint` with the
    # same dynamic dimensions, so with the same plan (except at batch 1, which dynamo specializes and remat plans
    # anew); None when not measured.
    measured_peak: int | None
    measured_next: int | None
    expr: sympy.Expr  # the plan's peak bytes as a function of `symbol`
    symbol: sympy.Symbol  # the batch size in `expr` (a positive integer)
    budget_bytes: int  # the budget searched against
    hint: int  # the batch size the plan was made at
    plan: Plan = dataclasses.field(repr=False)  # the plan, made at `hint`; its decisions hold at every batch


def default_loss(output: Any) -> torch.Tensor:
    """The sum of every floating-point tensor in `output` (nested tuples, lists, dicts) that requires grad: a
    scalar whose backward seeds each output with ones. No dtype conversion, so it allocates nothing output-sized."""
    leaves = [
        t
        for t in _torch.tree_leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not leaves:
        raise ValueError(
            "max_batch: the model's output has no floating-point tensor that requires grad; "
            "pass loss_fn=... to turn the output into a scalar loss"
        )
    total = leaves[0].sum()
    for t in leaves[1:]:
        total = total + t.sum()
    return total


def max_batch(
    model: Callable[..., Any],
    make_inputs: Callable[[int], Any],
    memory_budget: int | str,
    *,
    batch_dim: int = 0,
    start: int = 1,
    limit: int = 1 << 16,
    measure: bool = True,
    inner: Literal["inductor", "aot_eager", "eager"] = "aot_eager",
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    hint: int = 4,
    **fields: Any,
) -> BatchFit:
    """The largest batch size whose training step fits `memory_budget` under remat's plan.

    Args:
        model: an `nn.Module` (or a callable) run as `model(*make_inputs(batch))`.
        make_inputs: batch size → the model's positional inputs (a tuple, or one tensor). The inputs whose
            dimension `batch_dim` equals the batch size are the batch inputs; the others are left static.
        memory_budget: bytes, an int or a string with a unit ("6GiB"). Both the planner's budget and the bound the
            search fits under. A fraction is refused: it is relative to the peaks at one batch size.
        batch_dim: the batch dimension of the batch inputs.
        start, limit: the batch sizes searched, inclusive; `limit` is returned when even it fits.
        measure: also run one training step at the answer and one above it, and measure their peaks with
            `remat.peak_memory` (parameter gradients left out). Only `measure=True` runs the model at those sizes.
        inner: the inner compiler of the measured steps ("aot_eager", "eager" or "inductor").
        loss_fn: output → scalar loss for the measured steps; default `default_loss` (sum of the outputs).
        hint: the batch size the step is traced and planned at, >= 2 (0 and 1 would be specialized by dynamo).
        **fields: other RematConfig fields (solver, save_ops, policy, ...).

    The plan is made once, at `hint`; its peak as a function of the batch is `BatchFit.expr` and the search
    (doubling from `start`, then bisection) runs on it. Raises ValueError when even `start` does not fit.
    """
    budget = _budget_bytes(memory_budget)
    _check_int("start", start, 1)
    _check_int("limit", limit, start)
    _check_int("hint", hint, 2)
    config = RematConfig(memory_budget=budget, inner=inner, **fields)

    inputs, dims = _batch_inputs(make_inputs, hint, batch_dim)
    for i, dim in dims:
        _torch.mark_dynamic(inputs[i], dim)
    joints = capture_joints(model, *inputs, inner=inner)
    if len(joints) != 1:
        raise ValueError(
            f"max_batch: the model compiled to {len(joints)} graphs (graph breaks); the peak of a step "
            "split into several graphs is not one expression — make the model compile to one graph "
            "(torch._dynamo.explain(model)(*inputs) lists the breaks)"
        )
    planned = plan_joint(joints[0].joint, joints[0].num_fwd_outputs, config)
    peak_expr, _ = symbolic_memory(planned.problem, planned.resolved)
    expr, symbol = _in_one_symbol(peak_expr, planned.problem.graph.symbols)
    peak_at = _evaluator(expr, symbol)

    if peak_at(start) > budget:
        raise ValueError(
            f"memory_budget={memory_budget!r}: even batch {start} does not fit; this plan's peak is "
            f"{peak_at(start)} bytes there ({expr} bytes at batch {symbol}); raise the budget or "
            f"lower start="
        )
    batch = _search(peak_at, budget, start, limit)

    measured_peak = measured_next = None
    if measure:
        measured_peak, measured_next = _measured_peaks(
            model, make_inputs, config, dims, hint, (batch, batch + 1), loss_fn, planned.plan
        )
    return BatchFit(
        batch,
        peak_at(batch),
        peak_at(batch + 1),
        measured_peak,
        measured_next,
        expr,
        symbol,
        budget,
        hint,
        planned.plan,
    )


def _budget_bytes(memory_budget: Any) -> int:
    forms = 'max_batch needs a budget in bytes, an int or a string such as "6GiB"'
    if memory_budget is None:
        raise ValueError(f"memory_budget=None: {forms}")
    if isinstance(memory_budget, numbers.Real) and not isinstance(memory_budget, (bool, numbers.Integral)):
        raise ValueError(
            f"memory_budget={memory_budget!r}: {forms}; a fraction is relative to the least and the "
            f"baseline peak at one batch size, which max_batch varies"
        )
    return parse_bytes(memory_budget)


def _check_int(option: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{option}={value!r}: expected an int >= {least}")
    if value < least:
        raise ValueError(f"{option}={value!r}: expected an int >= {least}")


def _as_args(inputs: Any) -> tuple:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _batch_inputs(make_inputs: Callable[[int], Any], hint: int, batch_dim: int) -> tuple[tuple, list[tuple[int, int]]]:
    """make_inputs(hint), and (position, dimension) of each input whose `batch_dim` follows the batch size (checked
    against make_inputs(hint + 1), so a static dimension that happens to equal the hint is not taken)."""
    inputs, probe = _as_args(make_inputs(hint)), _as_args(make_inputs(hint + 1))
    dims = []
    for i, (a, b) in enumerate(zip(inputs, probe)):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and -a.dim() <= batch_dim < a.dim():
            dim = batch_dim % a.dim()
            if a.shape[dim] == hint and b.dim() == a.dim() and b.shape[dim] == hint + 1:
                dims.append((i, dim))
    if not dims:
        raise ValueError(
            f"max_batch: no input of make_inputs({hint}) has dimension {batch_dim} equal to the batch "
            f"size (and {hint + 1} for make_inputs({hint + 1})); set batch_dim= to the batch dimension"
        )
    return inputs, dims


def _in_one_symbol(expr: sympy.Expr, symbols: Sequence[str]) -> tuple[sympy.Expr, sympy.Symbol]:
    """Only batch dimensions are dynamic, so every size symbol is the batch size; dynamo may give inputs whose
    sizes never meet separate symbols. They are all replaced by the first."""
    free = sorted(expr.free_symbols, key=lambda s: s.name)
    if not free:
        names = sorted(symbols)
        symbol = sympy.Symbol(names[0] if names else "batch", integer=True, positive=True)
        return expr, symbol
    symbol = free[0]
    return expr.xreplace({s: symbol for s in free[1:]}), symbol


def _evaluator(expr: sympy.Expr, symbol: sympy.Symbol) -> Callable[[int], int]:
    cache: dict[int, int] = {}

    def peak_at(batch: int) -> int:
        if batch not in cache:
            cache[batch] = int(expr.xreplace({symbol: sympy.Integer(batch)}))
        return cache[batch]

    return peak_at


def _search(peak_at: Callable[[int], int], budget: int, start: int, limit: int) -> int:
    """Largest b in [start, limit] with peak_at(b) <= budget, given peak_at(start) fits and the peak does not fall
    as the batch grows: doubling to bracket it, then bisection."""
    fits, step = start, 1
    while fits < limit:
        probe = min(fits + step, limit)
        if peak_at(probe) > budget:
            break
        fits, step = probe, step * 2
    else:
        return limit
    over = probe
    while over - fits > 1:
        middle = (fits + over) // 2
        if peak_at(middle) <= budget:
            fits = middle
        else:
            over = middle
    return fits


def _measured_peaks(
    model, make_inputs, config: RematConfig, dims, hint: int, batches: Sequence[int], loss_fn, plan: Plan
) -> list[int]:
    """Peak of one training step at each batch, run through remat with the plan made at `hint`: the step is compiled
    at `hint` with the same dynamic dimensions, so the larger batches reuse that graph and its decisions."""
    from . import backend

    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    grads = [p.grad for p in params]
    cuda = sorted({p.device.index or 0 for p in params if p.is_cuda})

    def clear() -> None:
        for p in params:
            p.grad = None

    def step(args: tuple) -> None:
        loss_fn(compiled(*args)).backward()

    peaks = []
    try:
        with torch.random.fork_rng(devices=cuda), scoped.session():
            # Through a code object of its own, forgotten afterwards (remat.scoped): the caller's compiled
            # functions keep their code.
            compiled = torch.compile(
                scoped.own_code(model), backend=lambda gm, example: backend.compile_graph(gm, example, config)
            )
            args = _as_args(make_inputs(hint))
            for i, dim in dims:
                _torch.mark_dynamic(args[i], dim)
            clear()
            step(args)
            used = backend.last_plan()
            if (used.saved, used.recomputed) != (plan.saved, plan.recomputed):
                warnings.warn(
                    "max_batch: the measured step was planned differently from the predicted one; "
                    "the measured peaks are not of the same plan",
                    stacklevel=3,
                )
            for batch in batches:
                peaks.append(warm_training_peak(step, params, _as_args(make_inputs(batch))))
    finally:
        for p, g in zip(params, grads):
            p.grad = g
    return peaks
