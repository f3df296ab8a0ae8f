"""Step time side by side: each remat row against the row it is held to, both timed in alternation in one process.

    python benchmarks/paired_time.py [--models gpt,mlp,gpt2,llama] [--rounds 15] [--warmup 2]
                                     [--out benchmarks/results/paired_time.json] [--md benchmarks/PAIRED_TIME.md]

run.py times each row in a stretch of its own. On a shared machine the load drifts between stretches by more than
the differences the step-time checks look for (REPORT.md gives each row's spread). Here the two rows of a pair are
built and warmed up (compiled) together, then timed one step at a time in alternation — A B, B A, A B, ... — so a
drift slows both alike. The ratio reported is the median of A's steps over the median of B's; the per-round ratios
(A's step over B's step of the same round) give the quartiles shown beside it.

The pairs are the step-time checks of REPORT.md (issue 12), built as run.py builds those rows (rows.build, same
inner compiler, fallback_random, model and loss compiled as one graph):
- `remat None` against plain `inductor`: at most 1.03 ×;
- `remat bytes = <recipe>` against the hand recipe's eager row, the budget being that recipe's measured peak in
  this run (remat.peak_memory, parameter gradients excluded): at most 1.0 ×. The remat row's measured peak is
  given beside it, against that budget.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402

import remat  # noqa: E402
from remat.measure import training_peak  # noqa: E402
import outputs  # noqa: E402
import rows  # noqa: E402
from checks import NONE_TIME_SLACK, RECIPE_ROWS  # noqa: E402
from workloads import WORKLOADS, Workload  # noqa: E402

INNER = "inductor"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt,mlp,gpt2,llama", help="comma-separated (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=15, help="timed steps of each row (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each row, the first compiles")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "paired_time.json")
    parser.add_argument("--md", type=Path, default=HERE / "PAIRED_TIME.md")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(args.models) - set(WORKLOADS))
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.rounds < 3 or args.warmup < 1:
        parser.error("--rounds must be at least 3 and --warmup at least 1 (the first warm-up step compiles)")
    return args


class Built:
    """One row built and warmed up: its model copy and one training step."""

    def __init__(self, spec: rows.RowSpec, workload: Workload, warmup: int):
        self.spec = spec
        self.model = copy.deepcopy(workload.model)
        self.inputs = workload.inputs
        before = remat.recent_plans()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a budget remat cannot meet warns; the peak beside it tells
            with rows.row_context(spec, INNER, fallback_random=True, fresh_cache=False):
                self.forward = rows.build(spec, self.model, INNER, workload, compile_loss=True)
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
        "ratio": median_a / median_b,
        "round_ratio_quartiles": quartiles(per_round),
        "limit": limit,
        "step_ms_all": times_a,
        "against_step_ms_all": times_b,
    }


def run_model(name: str, args: argparse.Namespace) -> list[dict]:
    factory, batches = WORKLOADS[name]
    workload = factory(batches[0], seed=0)
    out = []
    torch._dynamo.reset()
    plain = Built(rows.RowSpec(INNER, "compiled", "inductor"), workload, args.warmup)
    none = Built(rows.RowSpec("remat None", "remat", "remat", budget=None), workload, args.warmup)
    out.append(pair(name, none, plain, args.rounds, NONE_TIME_SLACK))
    del plain, none
    for row_name, recipe in RECIPE_ROWS:
        torch._dynamo.reset()
        hand = Built(rows.RowSpec(row_name, "checkpoint", "eager", recipe=recipe), workload, args.warmup)
        budget = hand.peak()
        spec = rows.RowSpec(f"remat bytes = {recipe}", "remat", "remat", budget=budget)
        ours = Built(spec, workload, args.warmup)
        result = pair(name, ours, hand, args.rounds, 1.0)
        result["measured_peak_bytes"] = ours.peak()
        out.append(result)
        del hand, ours
    for r in out:
        print(f"  {name}: {r['row']} vs {r['against']}: {r['ratio']:.3f}x", flush=True)
    return out


def verdicts(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        ok = r["ratio"] <= r["limit"]
        low, high = r["round_ratio_quartiles"]
        lines.append(
            f"{'PASS' if ok else 'FAIL'}: {r['model']} `{r['row']}` vs `{r['against']}`: {r['ratio']:.3f}x "
            f"(limit {r['limit']}x; per-round ratios' quartiles {low:.3f}-{high:.3f})"
        )
    return lines


def table(results: list[dict]) -> str:
    mib = 2**20
    lines = [
        "| model | row | against | step ms | against ms | ratio | per-round quartiles | limit | peak / budget |",
        "|---|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        low, high = r["round_ratio_quartiles"]
        peak = (
            f"{r['measured_peak_bytes'] / mib:.1f} / {r['budget_bytes'] / mib:.1f} MiB"
            if r.get("budget_bytes")
            else "-"
        )
        lines.append(
            f"| {r['model']} | {r['row']} | {r['against']} | {r['step_ms']:.1f} | {r['against_step_ms']:.1f} | "
            f"{r['ratio']:.3f} | {low:.3f}-{high:.3f} | {r['limit']} | {peak} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows.warm_up_compiler(INNER)
    results = []
    for name in args.models:
        print(f"== {name}", flush=True)
        results.extend(run_model(name, args))
    lines = verdicts(results)
    meta = outputs.machine(sys.argv[1:] if argv is None else argv)
    meta.update(rounds=args.rounds, warmup=args.warmup)
    intro = (
        f"{outputs.setup('paired_time.py', meta)} {meta['torch_threads']} torch threads. Each pair's two rows were "
        f"compiled in one process and then timed in alternation, {args.rounds} steps each after {args.warmup} "
        "warm-up steps; the ratio is of the two medians (the module docstring says why and how)."
    )
    payload = {"meta": meta, "results": results, "verdicts": lines}
    outputs.write(args.out, args.md, payload, "Step time, paired", intro, table(results), lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
