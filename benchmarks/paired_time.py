"""Step time side by side: each remat row against the row it is held to, both timed in alternation in one process.

    python benchmarks/paired_time.py [--models gpt,mlp,gpt2,llama] [--rounds 25] [--warmup 2]
                                     [--out benchmarks/results/paired_time.json] [--md benchmarks/PAIRED_TIME.md]

The pairs of REPORT.md's step-time checks, timed in alternation in one process (pairs.py says how and why), on
their own: run.py times the same pairs after each model's rows. Here the budget of remat's row at a hand recipe is
that recipe's peak measured in this process (remat.peak_memory, parameter gradients excluded); the remat row's
measured peak is given beside it, against that budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import outputs  # noqa: E402
import pairs  # noqa: E402
import rows  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

INNER = "inductor"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt,mlp,gpt2,llama", help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=25,
        help="timed steps of each row, twice as many for remat None's pair (default: %(default)s)",
    )
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


def run_model(name: str, args: argparse.Namespace) -> list[dict]:
    factory, batches = WORKLOADS[name]
    out = pairs.check_pairs(factory(batches[0], seed=0), args.rounds, args.warmup, INNER)
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
        "| model | row | against | step ms | against ms | ratio | per-round quartiles | medians' ratio | limit | "
        "peak / budget |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|",
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
            f"{r['ratio']:.3f} | {low:.3f}-{high:.3f} | {r['ratio_of_medians']:.3f} | {r['limit']} | {peak} |"
        )
        control = r.get("plain_vs_itself")
        if control:
            c_low, c_high = control["round_ratio_quartiles"]
            lines.append(
                f"| {r['model']} | {r['against']} (a second build) | {r['against']} | - | - | {control['ratio']:.3f} | "
                f"{c_low:.3f}-{c_high:.3f} | - | - | - |"
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
        f"compiled in one process and then timed in alternation, {args.rounds} steps each (`remat None`'s pair "
        f"{pairs.NONE_ROUNDS * args.rounds}) after {args.warmup} warm-up steps; the ratio is the median of the "
        "per-round ratios, each of two steps run back to back (pairs.py says why and how); the medians' ratio is "
        "beside it. Each `remat None` pair comes with the plain row timed against a second build of itself: the "
        "same code, so its ratio is this run's timing noise."
    )
    payload = {"meta": meta, "results": results, "verdicts": lines}
    outputs.write(args.out, args.md, payload, "Step time, paired", intro, table(results), lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
