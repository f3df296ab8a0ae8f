"""What is planned against what runs: each remat row's simulated peak next to its measured peak, no timing.

    python benchmarks/fidelity.py [--models gpt,mlp,gpt2,llama] [--rows None,1.0,0.5,0.2,0.0,contiguous-0.5]
                                  [--inner inductor] [--out benchmarks/results/fidelity.json]
                                  [--md benchmarks/FIDELITY.md]

The remat rows of `run.py` without their step timing, so a change to the simulation is checked on every benchmark
model in a few minutes: each row compiles a fresh copy of the model with its loss (`rows.build`, under
`rows.row_context`: an empty inductor cache, inductor's dropout drawn as eager draws it), runs one step, then measures
the next with `remat.peak_memory` (parameter gradients left out), and reads the plan compiled for it. The checks are
run.py's: measured within 5% of simulated on every row, measured <= 1.05 x the budget on every row with one.
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # the checkout's remat and the benchmark's modules

import torch  # noqa: E402

import outputs  # noqa: E402
import remat  # noqa: E402
import rows  # noqa: E402
from findings import BUDGET_SLACK, SIM_TOLERANCE  # noqa: E402
from remat.units import MIB  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

ROWS = ("None", "1.0", "0.5", "0.2", "0.0", "contiguous-0.5")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt,mlp,gpt2,llama", help="comma-separated (default: %(default)s)")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--inner", default="inductor", choices=("inductor", "aot_eager"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fidelity.json")
    parser.add_argument("--md", type=Path, default=HERE / "FIDELITY.md")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.rows = [r for r in args.rows.split(",") if r]
    for name in args.models:
        if name not in WORKLOADS:
            parser.error(f"--models: {name!r} is not a benchmark model; choose from {', '.join(WORKLOADS)}")
    for row in args.rows:
        if row not in ROWS:
            parser.error(f"--rows: {row!r} is not a row; choose from {', '.join(ROWS)}")
    return args


def spec_of(row: str) -> rows.RowSpec:
    """The remat row: no budget, a fraction, or a fraction with contiguous=True."""
    if row == "None":
        return rows.RowSpec("remat None", "remat", "remat")
    if row.startswith("contiguous-"):
        fraction = float(row.removeprefix("contiguous-"))
        return rows.RowSpec(f"remat contiguous {fraction}", "remat", "remat", fraction, options=(("contiguous", True),))
    return rows.RowSpec(f"remat fraction {row}", "remat", "remat", float(row))


def measure(name: str, row: str, inner: str) -> dict:
    build, (batch, _) = WORKLOADS[name]
    workload = build(batch)
    model = copy.deepcopy(workload.model)
    spec = spec_of(row)
    torch._dynamo.reset()
    rows.POOL.clear()
    forward = rows.build(spec, model, inner, workload, compile_loss=True)
    with rows.row_context(spec, inner, fallback_random=True):
        forward(*workload.inputs).backward()  # compiles
        plan = remat.last_plan()
        for p in model.parameters():
            p.grad = None
        measured = remat.peak_memory(
            lambda: forward(*workload.inputs).backward(), exclude=lambda: [p.grad for p in model.parameters()]
        )
    return {
        "model": name,
        "row": spec.name,
        "simulated_bytes": plan.peak_bytes,
        "measured_bytes": measured,
        "budget_bytes": plan.budget_bytes,
        "saved_bytes": plan.saved_bytes,
    }


def verdicts(results: list[dict]) -> list[str]:
    off = [r for r in results if abs(_diff(r)) > SIM_TOLERANCE]
    over = [r for r in results if r["budget_bytes"] and _over(r) > BUDGET_SLACK]
    outside = "; ".join(f"{r['model']} `{r['row']}` {_diff(r):+.1%}" for r in off)
    above = "; ".join(f"{r['model']} `{r['row']}` {_over(r):.3f}x" for r in over)
    return [
        f"{'FAIL' if off else 'PASS'}: measured within {SIM_TOLERANCE:.0%} of simulated on "
        f"{len(results) - len(off)} of {len(results)} rows" + (f"; outside: {outside}" if off else ""),
        f"{'FAIL' if over else 'PASS'}: measured <= {BUDGET_SLACK} x budget on every row with one"
        + (f"; over: {above}" if over else ""),
    ]


def _over(r: dict) -> float:
    return r["measured_bytes"] / r["budget_bytes"]


def _diff(r: dict) -> float:
    return (r["measured_bytes"] - r["simulated_bytes"]) / r["simulated_bytes"]


def table(results: list[dict]) -> str:
    lines = [
        "| model | row | simulated MiB | measured MiB | measured vs simulated | budget MiB | measured / budget |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        budget = r["budget_bytes"]
        lines.append(
            f"| {r['model']} | {r['row']} | {r['simulated_bytes'] / MIB:.2f} | {r['measured_bytes'] / MIB:.2f} | "
            f"{_diff(r):+.1%} | " + (f"{budget / MIB:.2f} | {_over(r):.3f} |" if budget else "- | - |")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(2)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an infeasible budget warns; the figures are what is reported
        for name in args.models:
            for row in args.rows:
                results.append(measure(name, row, args.inner))
                r = results[-1]
                print(
                    f"{name} {row}: simulated {r['simulated_bytes'] / MIB:.2f} MiB, measured "
                    f"{r['measured_bytes'] / MIB:.2f} MiB ({_diff(r):+.1%})",
                    flush=True,
                )
    lines = verdicts(results)
    meta = outputs.machine(sys.argv[1:] if argv is None else argv)
    intro = (
        f"{outputs.setup('fidelity.py', meta)} Inner compiler `{args.inner}`. Each row compiled afresh (empty "
        "inductor cache, inductor's dropout drawn as eager draws it), one step run, the next measured with "
        "`remat.peak_memory`, parameter gradients left out; simulated is the plan's `peak_bytes`."
    )
    outputs.write(
        args.out,
        args.md,
        {"meta": meta, "rows": results, "verdicts": lines},
        "Simulated vs measured peak",
        intro,
        table(results),
        lines,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
