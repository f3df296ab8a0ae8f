"""Benchmark rows: how each configuration is built, and how one row is measured.

A row is one way of training the same model on the same inputs: plain eager, eager with per-block checkpointing,
a plain compile, torch's own ``activation_memory_budget``, or the remat backend under a budget. ``measure_row``
builds it from a fresh copy of the workload's model and returns one flat dict of measurements.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch._inductor.utils
from findings import RECIPE_ROWS
from torch import nn
from torch.utils.checkpoint import checkpoint
from workloads import Workload

import remat
from remat.runtime.buffers import POOL
from remat.units import MIB as MiB  # noqa: F401  (run.py reads rows.MiB)

TORCH_BUDGETS = (0.5, 0.2, 0.0)
REMAT_FRACTIONS = (1.0, 0.5, 0.2, 0.0)
# RECIPE_ROWS (findings.py): the hand-written recipes users apply today, as eager rows: (row name, recipe).


@dataclass(frozen=True)
class RowSpec:
    """One configuration to measure."""

    name: str
    kind: str
    """eager | checkpoint | compiled | torch | remat."""
    group: str
    """Name the ``--rows`` filter also matches (the plain compile row is "inductor" even under aot_eager)."""
    budget: float | int | None = None
    """torch rows: activation_memory_budget; remat rows: memory_budget (fraction, or bytes once resolved)."""
    budget_from: str | None = None
    """remat rows only: take the budget in bytes from the measured peak of the row with this name."""
    recipe: str = ""
    """checkpoint rows only: "per-block", "per-2-blocks" or "op-SAC" (see ``_wrap_blocks``)."""
    options: tuple[tuple[str, Any], ...] = ()
    """remat rows only: further options (offload, contiguous)."""

    @property
    def compiled(self) -> bool:
        return self.kind in ("compiled", "torch", "remat")

    def selected(self, prefixes: list[str]) -> bool:
        return any(self.name.startswith(p) or self.group.startswith(p) for p in prefixes)


def row_specs(inner: str) -> list[RowSpec]:
    """Every row, in the order they run: torch rows come before the remat rows that reuse their peaks."""
    specs = [RowSpec("eager", "eager", "eager")]
    specs += [RowSpec(name, "checkpoint", "eager", recipe=recipe) for name, recipe in RECIPE_ROWS]
    specs.append(RowSpec(inner, "compiled", "inductor"))
    specs += [RowSpec(f"torch budget {b}", "torch", "torch", budget=b) for b in TORCH_BUDGETS]
    specs += [RowSpec(f"remat fraction {f}", "remat", "remat", budget=f) for f in REMAT_FRACTIONS]
    specs += [
        RowSpec(f"remat bytes = torch {b}", "remat", "remat", budget_from=f"torch budget {b}") for b in TORCH_BUDGETS
    ]
    specs += [RowSpec(f"remat bytes = {recipe}", "remat", "remat", budget_from=name) for name, recipe in RECIPE_ROWS]
    specs.append(RowSpec("remat None", "remat", "remat", budget=None))
    # The runtime's other actions: every saved value to host (on CPU the host is the device: this row shows the
    # copies' cost, not a saving), and saved values in one reused arena.
    specs.append(RowSpec("remat offload", "remat", "remat-runtime", budget=None, options=(("offload", True),)))
    specs.append(RowSpec("remat contiguous 0.5", "remat", "remat-runtime", budget=0.5, options=(("contiguous", True),)))
    return specs


# torchtitan's op-level selective checkpoint: outputs of these ops are saved, the rest of each block recomputed.
SAC_SAVED = tuple(
    getattr(torch.ops.aten, name).default
    for name in (
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
    )
    if hasattr(torch.ops.aten, name)
)


def _sac_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in SAC_SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def _sac_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_sac_policy)


class _Checkpointed(nn.Module):
    """Runs the wrapped block under non-reentrant activation checkpointing (RNG state preserved).

    Arguments and results pass through unchanged: HF blocks take extra positional and keyword arguments (mask,
    cache, flags; some ``None``) and may return a tuple, which non-reentrant checkpointing accepts as they are.
    """

    def __init__(self, block: nn.Module, selective: bool = False) -> None:
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.selective:
            return checkpoint(self.block, *args, use_reentrant=False, context_fn=_sac_context, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


class _Group(nn.Module):
    """Consecutive blocks run as one (for checkpointing them together); every other block passes through."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.returns_tuple = False  # HF blocks return (hidden_states, ...); the stand-ins after it must too

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        for block in self.blocks:
            out = block(x, *args, **kwargs)
            self.returns_tuple = isinstance(out, tuple)
            x = out[0] if self.returns_tuple else out
        return out


class _Skip(nn.Module):
    """Stands in for a block that the group before it already ran: passes the hidden state on unchanged."""

    def __init__(self, group: _Group) -> None:
        super().__init__()
        self.__dict__["group"] = group  # not a submodule: its parameters belong to the group's slot

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return (x,) if self.group.returns_tuple else x


def _wrap_blocks(blocks: nn.ModuleList | nn.Sequential, recipe: str) -> None:
    """per-block: checkpoint around each block; per-2-blocks: around each pair; op-SAC: each block under a
    selective checkpoint that saves matmul and attention outputs."""
    if recipe == "per-2-blocks":
        for i in range(0, len(blocks), 2):
            group = _Group([blocks[j] for j in range(i, min(i + 2, len(blocks)))])
            blocks[i] = _Checkpointed(group)
            for j in range(i + 1, i + len(group.blocks)):
                blocks[j] = _Skip(group)
        return
    for i in range(len(blocks)):
        blocks[i] = _Checkpointed(blocks[i], selective=recipe == "op-SAC")


class _WithLoss(nn.Module):
    """The model and its loss as one module, so one compiled graph (and one plan) covers the whole forward."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model, *inputs)


def build(
    spec: RowSpec, model: nn.Module, inner: str, workload: Workload, compile_loss: bool
) -> Callable[..., torch.Tensor]:
    """``forward(*inputs) -> loss`` of one row; ``model`` (a fresh copy) is wrapped in place for checkpointing.

    Compiled rows compile the model together with its loss when ``compile_loss``, else the model alone (the loss
    then runs eagerly on the compiled model's output, outside the budget's reach).
    """
    if spec.kind == "checkpoint":
        _wrap_blocks(workload.blocks(model), spec.recipe)
    if not spec.compiled:
        return _WithLoss(model, workload.loss_fn)
    if spec.kind == "remat":
        backend, options = "remat", {"memory_budget": spec.budget, "inner": inner, **dict(spec.options)}
    else:
        backend, options = inner, None
    if compile_loss:
        return torch.compile(_WithLoss(model, workload.loss_fn), backend=backend, options=options)
    return _WithLoss(torch.compile(model, backend=backend, options=options), workload.loss_fn)


@contextlib.contextmanager
def row_context(spec: RowSpec, inner: str, fallback_random: bool, fresh_cache: bool = True) -> Iterator[None]:
    """Config patches active for the whole row, compilation (the first call) included; undone afterwards.

    ``fresh_cache``: a compiled row under inductor compiles with an empty inductor cache directory and cleared
    in-process code caches, so it builds every kernel itself; else it may reuse kernels earlier rows built.
    """
    with contextlib.ExitStack() as stack:
        if spec.kind == "torch":
            stack.enter_context(torch._functorch.config.patch(activation_memory_budget=spec.budget))
        if spec.compiled and inner == "inductor":
            # every row compiles from scratch: compile times compare, no row reuses another's cached code (graphs,
            # autotuning, nor kernels: an empty inductor cache directory and cleared in-process code caches)
            stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False))
            if fresh_cache:
                stack.enter_context(torch._inductor.utils.fresh_cache())
        if spec.compiled and inner == "inductor" and fallback_random:
            # inductor draws its own random numbers; with eager's, dropout masks match and gradients compare
            stack.enter_context(torch._inductor.config.patch(fallback_random=True))
        yield


def warm_up_compiler(inner: str, device: str = "cpu") -> None:
    """Compile and run a small forward+backward once, before any row: the first compile of a process also pays
    one-time start-up (imports, compile workers) that would otherwise land in the first compiled row's time."""
    with row_context(RowSpec("warm-up", "compiled", "inductor"), inner, fallback_random=False):
        x = torch.randn(8, 8, device=device, requires_grad=True)
        torch.compile(lambda t: (t.sin() @ t).sum(), backend=inner)(x).backward()
    torch._dynamo.reset()


def saved_bytes(forward: Callable[..., torch.Tensor], workload: Workload, model: nn.Module) -> int:
    """Bytes autograd saves for backward during one forward+loss: unique storages passed to the pack hook.

    Parameters, buffers and inputs are left out (they are not activation memory). Values a checkpoint wrapper
    keeps outside autograd (its block inputs) are not seen by the hook and not counted.
    """
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), *workload.inputs]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward(*workload.inputs)
    del loss
    return sum(seen.values())


def _clear_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def reference(workload: Workload, seed: int) -> tuple[float, list[torch.Tensor]]:
    """Loss and parameter gradients of the uncompiled model, with the global RNG seeded to ``seed``."""
    model = copy.deepcopy(workload.model)
    torch.manual_seed(seed)
    loss = workload.loss_fn(model, *workload.inputs)
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


def _grad_errors(model: nn.Module, ref_grads: list[torch.Tensor]) -> tuple[float, float]:
    """(max abs difference over all gradient entries, worst per-parameter relative error ||g - g_ref|| / ||g_ref||)."""
    abs_diff = rel_err = 0.0
    for p, ref in zip(model.parameters(), ref_grads, strict=True):
        if p.grad is None:
            return float("inf"), float("inf")
        diff = (p.grad - ref).abs()
        abs_diff = max(abs_diff, diff.max().item())
        rel_err = max(rel_err, (diff.norm() / ref.norm().clamp_min(1e-30)).item())
    return abs_diff, rel_err


def _plan_fields(before: tuple[remat.Plan, ...]) -> dict[str, Any]:
    """The plan of the graph remat compiled since ``before`` (``remat.recent_plans()`` earlier), as report fields.

    ``plan_graphs`` counts the graphs compiled: more than one means graph breaks, and the figures are the last
    graph's only (peaks of separate graphs do not add up).
    """
    new = [p for p in remat.recent_plans() if not any(p is q for q in before)]
    if not new:
        return {"plan_graphs": 0}
    plan = new[-1]
    return {
        "plan_graphs": len(new),
        "plan_saved_bytes": plan.saved_bytes,
        "plan_peak_bytes": plan.peak_bytes,
        "plan_recompute_flops": plan.recompute_flops,
        "plan_budget_bytes": plan.budget_bytes,
        "plan_feasible": plan.feasible,
        "plan_least_peak_bytes": plan.least_peak_bytes,
        "plan_solver": str(plan.solver),
        "plan_baseline_saved_bytes": plan.baseline.saved_bytes,
        "plan_baseline_peak_bytes": plan.baseline.peak_bytes,
    }


def measure_row(
    spec: RowSpec,
    workload: Workload,
    *,
    inner: str,
    seed: int,
    warmup: int,
    steps: int,
    ref: tuple[float, list[torch.Tensor]],
    fallback_random: bool,
    compile_loss: bool,
    fresh_cache: bool = True,
) -> dict[str, Any]:
    """Build the row from a fresh copy of the model and measure it; the returned dict is one report row."""
    row: dict[str, Any] = {
        "model": workload.name,
        "row": spec.name,
        "kind": spec.kind,
        "budget": spec.budget,
        "budget_kind": budget_kind(spec),
        "options": dict(spec.options),
    }
    model = copy.deepcopy(workload.model)
    if spec.compiled:
        torch._dynamo.reset()  # no compiled code or cache entries carried over from the previous row
        POOL.clear()  # nor a contiguous arena another row learned (it would be reused, and counted, here)

    with row_context(spec, inner, fallback_random, fresh_cache):
        forward = build(spec, model, inner, workload, compile_loss)

        def step() -> None:
            forward(*workload.inputs).backward()
            if workload.inputs[0].is_cuda:
                torch.cuda.synchronize()  # step times cover the kernels, not only their launches

        before = remat.recent_plans()
        for i in range(max(warmup, 1)):  # the first call compiles
            _clear_grads(model)
            t0 = time.perf_counter()
            step()
            if i == 0:
                row["first_step_s"] = time.perf_counter() - t0
                if spec.kind == "remat":
                    row.update(_plan_fields(before))  # right after compiling
        row["saved_bytes"] = saved_bytes(forward, workload, model)

        _clear_grads(model)
        row["measured_peak_bytes"] = remat.peak_memory(
            step, device=workload.inputs[0].device, exclude=lambda: [p.grad for p in model.parameters()]
        )

        times = []
        for _ in range(steps):
            _clear_grads(model)
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        row["step_ms"] = statistics.median(times)
        row["step_ms_all"] = times

        _clear_grads(model)
        torch.manual_seed(seed)
        loss = forward(*workload.inputs)
        loss.backward()
    ref_loss, ref_grads = ref
    row["loss_diff"] = abs(loss.item() - ref_loss)
    row["max_grad_diff"], row["max_grad_rel_err"] = _grad_errors(model, ref_grads)
    return row


def budget_kind(spec: RowSpec) -> str | None:
    if spec.kind == "torch":
        return "torch activation_memory_budget"
    if spec.kind != "remat" or spec.budget is None:
        return None
    return "bytes" if isinstance(spec.budget, int) else "fraction"
