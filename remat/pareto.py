"""Budget sweeps: plan one training graph under several budgets and solvers, optionally measure each, and measure
torch's own `activation_memory_budget` for comparison.

    result = remat.pareto(model, x, budgets=(1.0, 0.5, 0.0), solvers=("greedy", "mincut"))
    print(result.table()); result.plot().savefig("pareto.png")

Planning is simulated (no training step runs). With `measure=True` every row is also compiled and run: its measured
peak (`remat.peak_memory` of one forward+backward, gradients of parameters and inputs left out) and its median step
time, divided by the step time of a *reference*: the same model under plain `torch.compile(backend=inner)` with
torch's defaults, measured in the same call. `torch_budget_points` measures torch's budget the same way against the
same kind of reference, so remat's and torch's points share measured axes (peak MiB, step-time ratio); simulated
flops are never drawn against measured times.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

from . import _torch, scoped
from .backend import compile as remat_compile
from .config import RematConfig
from .explain import capture_joints
from .measure import warm_training_peak
from .pipeline import plan_joint
from .plan.solvers import named
from .units import MIB, render_table

__all__ = ["ParetoRow", "ParetoResult", "TorchPoint", "pareto", "torch_budget_points"]


@dataclasses.dataclass(frozen=True)
class ParetoRow:
    """One (solver, budget) point of a sweep."""

    solver: str
    budget: float | int | str | None  # memory_budget as given (fraction, bytes, unit string, None = baseline)
    budget_bytes: int | None  # the budget resolved to bytes; None without a budget
    peak_bytes: int  # simulated peak activation bytes of the plan
    saved_bytes: int  # bytes the forward hands to backward
    recompute_flops: int  # flops recomputed in backward
    feasible: bool  # simulated peak <= budget
    measured_peak_bytes: int | None = None  # measure=True: remat.peak_memory of one training step
    step_ms: float | None = None  # measure=True: median step time, milliseconds
    step_ratio: float | None = None  # measure=True: step_ms / ParetoResult.reference_step_ms


@dataclasses.dataclass(frozen=True)
class ParetoResult:
    rows: tuple[ParetoRow, ...]  # solvers outer, budgets inner, in the order given
    baseline_peak_bytes: int  # simulated peak of the plan that saves everything backward reads
    baseline_saved_bytes: int
    inner: str  # the inner compiler measured rows ran under (and the reference's torch.compile backend)
    reference_step_ms: float | None = None  # median step time of plain torch.compile(backend=inner); None unmeasured
    reference_peak_bytes: int | None = None  # measured peak of that reference; None unmeasured

    @property
    def measured(self) -> bool:
        return self.reference_step_ms is not None

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per row (pandas-ready: `pandas.DataFrame(result.to_records())`)."""
        return [dataclasses.asdict(r) for r in self.rows]

    def table(self) -> str:
        """A text table: one line per row, then the baseline (and the measured reference)."""
        head = ["solver", "budget", "budget MiB", "peak MiB", "saved MiB", "MFLOP", "feasible"]
        if self.measured:
            head += ["measured MiB", "step ms", "step ratio"]
        lines = [head]
        for r in self.rows:
            cells = [
                r.solver,
                "None" if r.budget is None else str(r.budget),
                _mib(r.budget_bytes),
                _mib(r.peak_bytes),
                _mib(r.saved_bytes),
                f"{r.recompute_flops / 1e6:.1f}",
                "yes" if r.feasible else "no",
            ]
            if self.measured:
                cells += [_mib(r.measured_peak_bytes), f"{r.step_ms:.2f}", f"{r.step_ratio:.2f}"]
            lines.append(cells)
        out = render_table(lines)
        out.append(
            f"baseline: peak {_mib(self.baseline_peak_bytes)} MiB, saved {_mib(self.baseline_saved_bytes)} MiB "
            "(simulated)"
        )
        if self.measured:
            out.append(
                f"reference torch.compile(backend={self.inner!r}): measured peak "
                f"{_mib(self.reference_peak_bytes)} MiB, step {self.reference_step_ms:.2f} ms"
            )
        return "\n".join(out)

    def plot(self, ax=None, torch_points=None, *, measured: bool | None = None):
        """`remat.plots.plot_pareto(self, ...)`; returns a matplotlib Figure."""
        from .plots import plot_pareto

        return plot_pareto(self, ax, torch_points, measured=measured)

    def __str__(self) -> str:
        return self.table()


class TorchPoint(NamedTuple):
    """One measured point of torch's activation_memory_budget, as `plot_pareto(torch_points=...)` takes it."""

    label: str  # "torch 0.5"
    peak_bytes: int  # remat.peak_memory of one training step
    overhead: float  # step time / the reference step time (plain torch.compile, torch's defaults)


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MIB:.2f}"


def pareto(
    model: Callable[..., Any],
    *inputs: Any,
    budgets: Sequence[float | int | str | None] = (1.0, 0.75, 0.5, 0.25, 0.0),
    solvers: Sequence[str] = ("auto",),
    measure: bool = False,
    inner: Literal["inductor", "aot_eager", "eager"] = "aot_eager",
    loss_fn: Callable[..., torch.Tensor] | None = None,
    repeat: int = 3,
    **fields: Any,
) -> ParetoResult:
    """Plan `model(*inputs)` (or `loss_fn(model, *inputs)`) once per (solver, budget) and return the rows.

    The joint graph is captured once (`remat.explain.capture_joints`) and planned per row with the RematConfig
    `fields` plus `memory_budget=budget, solver=solver`; every config is validated before anything runs.
    `measure=True` also compiles and runs each row under `inner` (and the reference, plain
    `torch.compile(backend=inner)`): one step compiles, one is measured by `remat.peak_memory` (gradients of
    parameters and of inputs left out, as the planner leaves them out), `repeat` more are timed (median).
    `model` is deep-copied when it is an `nn.Module`, so the caller's parameters, gradients and RNG state are left
    untouched; a plain callable is run as is (pass the module and `loss_fn` to keep its parameters' `.grad` clean).
    The model must compile to one graph (no graph breaks): peaks of separate graphs do not add up.
    """
    for option in ("memory_budget", "solver", "inner"):
        if option in fields:
            raise TypeError(f"pareto: {option} is set per row; pass budgets=[...], solvers=[...] and inner=... instead")
    if not budgets or not solvers:
        raise ValueError(f"pareto: budgets={budgets!r} and solvers={solvers!r} must each name at least one value")
    configs = [RematConfig(memory_budget=b, solver=s, inner=inner, **fields) for s in solvers for b in budgets]
    target = copy.deepcopy(model) if isinstance(model, nn.Module) else model
    captured = capture_joints(_bind(target, loss_fn), *inputs, inner=inner)
    if len(captured) != 1:
        raise ValueError(
            f"pareto: the model compiled to {len(captured)} graphs (graph breaks); a sweep compares "
            "peaks of one graph — find the breaks with torch._dynamo.explain and remove them"
        )
    (joint,) = captured
    plans = [plan_joint(joint.joint, joint.num_fwd_outputs, c).plan for c in configs]
    rows = [
        ParetoRow(
            named(c.solver)[0],
            c.memory_budget,
            p.budget_bytes,
            p.peak_bytes,
            p.saved_bytes,
            p.recompute_flops,
            p.feasible,
        )
        for c, p in zip(configs, plans)
    ]
    result = ParetoResult(tuple(rows), plans[0].baseline.peak_bytes, plans[0].baseline.saved_bytes, inner)
    if not measure:
        return result
    with torch.random.fork_rng(devices=[]):
        ref_peak, ref_ms = _measure(lambda fn: torch.compile(fn, backend=inner), model, inputs, loss_fn, repeat)
        measured = []
        for row, c in zip(rows, configs):
            build = functools.partial(remat_compile, **_fields(c))
            peak, ms = _measure(build, model, inputs, loss_fn, repeat)
            measured.append(dataclasses.replace(row, measured_peak_bytes=peak, step_ms=ms, step_ratio=ms / ref_ms))
    return dataclasses.replace(result, rows=tuple(measured), reference_step_ms=ref_ms, reference_peak_bytes=ref_peak)


def torch_budget_points(
    model: Callable[..., Any],
    *inputs: Any,
    budgets: Sequence[float] = (1.0, 0.5, 0.2, 0.0),
    loss_fn: Callable[..., torch.Tensor] | None = None,
    backend: str = "aot_eager",
    repeat: int = 3,
    reference_step_ms: float | None = None,
) -> list[TorchPoint]:
    """Measure torch's own `activation_memory_budget` (its min-cut partitioner) at each budget: one `TorchPoint`
    `(label, measured peak bytes, step-time ratio)` per budget, for `plot_pareto(torch_points=...)`.

    Each budget compiles a fresh deep copy of `model` with `torch.compile(backend=backend)` while
    `torch._functorch.config.activation_memory_budget` is patched (compile and runs; restored afterwards), each
    compile fresh and forgotten afterwards (`remat.scoped`: functions compiled elsewhere keep their code), and is
    measured as `remat.pareto(measure=True)` measures remat's rows.
    overhead = median step time / `reference_step_ms`; None: the reference (plain `torch.compile(backend=backend)`,
    torch's defaults) is measured here. Pass `result.reference_step_ms` of a measured sweep with `inner == backend`
    to put both sets of points over one reference measurement.
    """
    points = []
    with torch.random.fork_rng(devices=[]):
        if reference_step_ms is None:
            _, reference_step_ms = _measure(
                lambda fn: torch.compile(fn, backend=backend), model, inputs, loss_fn, repeat
            )
        for b in budgets:
            with _torch.activation_memory_budget(b):
                peak, ms = _measure(lambda fn: torch.compile(fn, backend=backend), model, inputs, loss_fn, repeat)
            points.append(TorchPoint(f"torch {b}", peak, ms / reference_step_ms))
    return points


def _fields(config: RematConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _bind(model: Callable[..., Any], loss_fn: Callable[..., torch.Tensor] | None) -> Callable[..., Any]:
    if loss_fn is None:
        return model

    def step(*xs: Any) -> torch.Tensor:
        return loss_fn(model, *xs)

    return step


def _measure(
    build: Callable[[Callable[..., Any]], Callable[..., Any]],
    model: Callable[..., Any],
    inputs: Sequence[Any],
    loss_fn: Callable[..., torch.Tensor] | None,
    repeat: int,
) -> tuple[int, float]:
    """(measured peak bytes, median step ms) of a training step of `build(model bound to loss_fn)`, on a fresh copy
    of the model and of the inputs that require grad. The compile is fresh and forgotten afterwards (`remat.scoped`):
    functions compiled elsewhere in the process keep their code."""
    with scoped.session():
        return _measure_step(build, model, inputs, loss_fn, repeat)


def _measure_step(
    build: Callable[[Callable[..., Any]], Callable[..., Any]],
    model: Callable[..., Any],
    inputs: Sequence[Any],
    loss_fn: Callable[..., torch.Tensor] | None,
    repeat: int,
) -> tuple[int, float]:
    target = copy.deepcopy(model) if isinstance(model, nn.Module) else model
    args = [
        x.detach().clone().requires_grad_() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in inputs
    ]
    leaves = [
        *(target.parameters() if isinstance(target, nn.Module) else ()),
        *(x for x in args if isinstance(x, torch.Tensor) and x.requires_grad),
    ]
    compiled = build(scoped.own_code(_bind(target, loss_fn)))

    def step() -> None:
        out = compiled(*args)
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                "measure: the model (or loss_fn) must return one tensor to run a training step; got "
                f"{type(out).__name__}"
            )
        out.backward(None if out.dim() == 0 else torch.ones_like(out))

    def clear() -> None:
        for t in leaves:
            t.grad = None

    peak = warm_training_peak(step, leaves)  # the first run compiles
    times = []
    for _ in range(max(repeat, 1)):
        clear()
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    clear()
    return peak, statistics.median(times)
