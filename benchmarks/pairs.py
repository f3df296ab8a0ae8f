"""Step time side by side: two rows built in one process and timed in alternation.

A row timed in a stretch of its own (run.py's step ms) meets whatever load the machine has then; on a shared machine
the load drifts between stretches by more than the differences the step-time checks look for. Here the two rows of
a pair are built and warmed up (compiled) together, then timed one step at a time in alternation — A B, B A, A B,
... — so a drift slows both alike. The ratio held to a check's limit is the median of the per-round ratios (A's step
over B's step of the same round): each compares two steps run back to back, so a slower stretch of the machine
cancels out of it, which the ratio of the two rows' medians does not do (that one is kept beside it, as
`ratio_of_medians`). The per-round ratios' quartiles are shown with it.

The `remat None` pair comes with a control: the plain row timed against a second build of itself (the same code,
`plain_vs_itself`), whose ratio is this run's timing noise at that step time. Its limit (1.03) is the tightest, so
it and its control run NONE_ROUNDS times the rounds: at 25 rounds the median per-round ratio of two builds of the
same code was seen spread by about ±2% (quartiles of single rounds ±5%).

The pairs are the step-time checks of the report (time_checks.py), built as run.py builds those rows (rows.build):
- `remat None` against the plain compiled row: at most NONE_TIME_SLACK ×;
- `remat bytes = <recipe>` against the hand recipe's eager row, the budget being that recipe's measured peak: at
  most 1.0 ×.
run.py times them after each model's rows (its recipe rows' peaks are the budgets); paired_time.py on its own.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections.abc import Callable

import rows
import torch
from findings import RECIPE_ROWS
from time_checks import NONE_TIME_SLACK
from workloads import Workload

import remat
from remat.measure import training_peak


NONE_ROUNDS = 2
"""The `remat None` pair and its control run this many times the rounds of the other pairs."""


class Built:
    """One row built and warmed up: its model copy and one training step."""

    def __init__(
        self,
        spec: rows.RowSpec,
        workload: Workload,
        warmup: int,
        inner: str = "inductor",
        fallback_random: bool = True,
        compile_loss: bool = True,
    ):
        self.spec = spec
        self.model = copy.deepcopy(workload.model)
        self.inputs = workload.inputs
        before = remat.recent_plans()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a budget remat cannot meet warns; the peak beside it tells
            with rows.row_context(spec, inner, fallback_random=fallback_random, fresh_cache=False):
                self.forward = rows.build(spec, self.model, inner, workload, compile_loss=compile_loss)
                for _ in range(warmup):
                    self.step()
        planned = any(not any(p is q for q in before) for p in remat.recent_plans())
        if spec.kind == "remat" and not planned:
            # the other row of the pair compiled the same code first: this row must run remat's own compile
            raise RuntimeError(f"{spec.name}: no remat plan was made; the row would time another row's code")

    def step(self) -> float:
        """One forward+backward from cleared gradients; its wall milliseconds."""
        rows._clear_grads(self.model)
        start = time.perf_counter()
        self.forward(*self.inputs).backward()
        if self.inputs[0].is_cuda:
            torch.cuda.synchronize()  # the step's kernels, not only their launches
        return (time.perf_counter() - start) * 1e3

    def peak(self) -> int:
        """Measured peak of one step, parameter gradients left out."""
        return training_peak(lambda: self.forward(*self.inputs).backward(), self.model.parameters())


def alternate(a: Built, b: Built, rounds: int) -> tuple[list[float], list[float]]:
    """Step times of `a` and `b`, one step each per round, the order flipped every round."""
    times_a, times_b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            times_a.append(a.step())
            times_b.append(b.step())
        else:
            times_b.append(b.step())
            times_a.append(a.step())
    return times_a, times_b


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def pair(model: str, a: Built, b: Built, rounds: int, limit: float) -> dict:
    """`a` timed against `b` in alternation: both medians, the median per-round ratio (`ratio`), the ratio of the
    medians, the per-round ratios' quartiles."""
    times_a, times_b = alternate(a, b, rounds)
    per_round = [x / y for x, y in zip(times_a, times_b)]
    median_a, median_b = statistics.median(times_a), statistics.median(times_b)
    return {
        "model": model,
        "row": a.spec.name,
        "against": b.spec.name,
        "budget_bytes": a.spec.budget if isinstance(a.spec.budget, int) else None,
        "step_ms": median_a,
        "against_step_ms": median_b,
        "ratio": statistics.median(per_round),
        "ratio_of_medians": median_a / median_b,
        "round_ratio_quartiles": quartiles(per_round),
        "limit": limit,
        "rounds": rounds,
        "step_ms_all": times_a,
        "against_step_ms_all": times_b,
    }


def check_pairs(
    workload: Workload,
    rounds: int,
    warmup: int,
    inner: str = "inductor",
    budget_of: Callable[[Built], int] | None = None,
    **build: bool,
) -> list[dict]:
    """Every step-time check's pair of one model, timed in alternation. `budget_of(recipe_row)`: the byte budget
    of remat's row at that recipe (default: the recipe's peak measured here); `build`: Built's fallback_random and
    compile_loss."""
    out = []
    torch._dynamo.reset()
    plain = Built(rows.RowSpec(inner, "compiled", "inductor"), workload, warmup, inner, **build)
    none = Built(rows.RowSpec("remat None", "remat", "remat", budget=None), workload, warmup, inner, **build)
    result = pair(workload.name, none, plain, NONE_ROUNDS * rounds, NONE_TIME_SLACK)
    again = Built(rows.RowSpec(inner, "compiled", "inductor"), workload, warmup, inner, **build)
    control = pair(workload.name, again, plain, NONE_ROUNDS * rounds, NONE_TIME_SLACK)
    result["plain_vs_itself"] = {k: control[k] for k in ("ratio", "round_ratio_quartiles")}
    out.append(result)
    del plain, none, again
    for row_name, recipe in RECIPE_ROWS:
        torch._dynamo.reset()
        hand = Built(rows.RowSpec(row_name, "checkpoint", "eager", recipe=recipe), workload, warmup, inner, **build)
        budget = (budget_of or Built.peak)(hand)
        spec = rows.RowSpec(f"remat bytes = {recipe}", "remat", "remat", budget=budget)
        ours = Built(spec, workload, warmup, inner, **build)
        result = pair(workload.name, ours, hand, rounds, 1.0)
        result["measured_peak_bytes"] = ours.peak()
        out.append(result)
        del hand, ours
    torch._dynamo.reset()
    return out
