"""The benchmark runner: every row (eager, checkpointing, torch's activation_memory_budget, remat) from one run.

    python benchmarks/run.py [--quick] [--threads N] [--out PATH.json] [--models gpt,mlp,gpt2]
                             [--inner inductor|aot_eager] [--rows eager,inductor,torch,remat] [--headline]

The two committed runs, one per inner compiler, each with its own outputs:

    python benchmarks/run.py --inner inductor --threads 1 --steps 5   # results/latest.json, benchmarks/REPORT.md
    python benchmarks/run.py --inner aot_eager --threads 1 --steps 5  # results/aot_eager.json, REPORT-aot_eager.md

All rows of a model train deep copies of one initialized model on the same inputs, on the same machine, in the
same process, so their memory and time compare as ratios (step times vary 10-15% between runs on small CPUs).
Writes JSON (rows + metadata) to --out (default: ``report.default_json(inner)``); next to it the flat markdown table
(same name, .md), the headline snippet (the table README.md shows) and the Pareto figure; and the full report
(tables, the figure, and what the numbers show, every statement computed from them). Derived files are named by
``report.derived`` and ``report.default_report_path``. `python benchmarks/report.py` rebuilds all but the JSON
from it, for both inner compilers' runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import shlex
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the checkout's remat, and the sibling modules, when run as a script

import torch  # noqa: E402

import compile_time  # noqa: E402
import pairs  # noqa: E402
import report  # noqa: E402
import rows  # noqa: E402
import solver_gaps  # noqa: E402
import time_checks  # noqa: E402
from workloads import WORKLOADS, on_device  # noqa: E402

ALL_ROWS = "eager,inductor,torch,remat"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small batches ("
        + ", ".join(f"{n} {b[1]}" for n, (_, b) in WORKLOADS.items())
        + "), 3 timed steps, --inner aot_eager by default",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output path; the flat table (.md), the headline snippet and the figure go next "
        "to it (default: benchmarks/results/latest.json with --inner inductor, "
        "benchmarks/results/aot_eager.json with --inner aot_eager)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="the full report (tables, checks, figure); default: benchmarks/REPORT.md for "
        "results/latest.json, benchmarks/REPORT-<stem>.md for results/<stem>.json, else the "
        "same name next to --out. The figure and the headline snippet always go next to --out",
    )
    parser.add_argument(
        "--headline",
        action="store_true",
        help="print only the headline snippet (for README.md) at the end instead of the full table",
    )
    parser.add_argument(
        "--models", default=",".join(WORKLOADS), help="comma-separated subset of: %(default)s (gpt2 needs transformers)"
    )
    parser.add_argument(
        "--inner",
        choices=("inductor", "aot_eager"),
        default=None,
        help="compiler of the compiled rows and remat's inner compiler (default: inductor; aot_eager with --quick)",
    )
    parser.add_argument(
        "--rows",
        default=ALL_ROWS,
        help="comma-separated prefixes of the rows to run: eager (eager and eager+checkpoint), "
        "inductor (the plain compile row, whatever --inner), torch, remat "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the models train: cpu or cuda (peaks from the allocator's events on that device; default: cpu)",
    )
    parser.add_argument(
        "--no-solvers",
        dest="solvers",
        action="store_false",
        help="skip the planning-only comparison of remat's solvers after the rows",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per row (default: 10; 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first, compile included (default: 2)")
    parser.add_argument(
        "--paired-rounds",
        type=int,
        default=None,
        help="after each model's rows, time each step-time check's two rows in alternation, this many steps "
        "each, twice as many for remat None's pair (pairs.py; the checks then read these ratios); 0 skips it "
        "(default: 25; 0 with --quick)",
    )
    parser.add_argument(
        "--compile-rounds",
        type=int,
        default=None,
        help="after each model's rows, re-time the first step of its slowest remat row (and of any over the "
        "compile-time limit) against plain inductor, each in a fresh process, this many rounds (compile_time.py; "
        "the compile-time check then reads these); 0 skips it (default: 2 under inductor on CPU with the loss "
        "compiled; else 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, inputs and the gradient check")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's choice). On shared VMs whose vCPUs are "
        "descheduled, 1 thread gives far steadier step times than the default",
    )
    parser.add_argument(
        "--loss-outside",
        dest="compile_loss",
        action="store_false",
        help="compile the model alone and compute the loss eagerly on its output; by default "
        "model and loss compile as one graph, so the budget covers the whole forward",
    )
    parser.add_argument(
        "--no-fallback-random",
        dest="fallback_random",
        action="store_false",
        help="let inductor draw its own random numbers (dropout masks then differ from eager's, "
        "so every compiled row shows a gradient difference)",
    )
    parser.add_argument(
        "--shared-compile-cache",
        dest="fresh_cache",
        action="store_false",
        help="let inductor rows reuse kernels earlier rows built (faster; the compile-time check "
        "then says its ratios do not compare compile times from equal caches). By default "
        "every inductor row compiles with an empty inductor cache",
    )
    args = parser.parse_args(argv)
    args.models = _split(args.models)
    unknown = sorted(set(args.models) - set(WORKLOADS))
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    args.rows = _split(args.rows)
    if args.inner is None:
        args.inner = "aot_eager" if args.quick else "inductor"
    if args.out is None:
        args.out = report.default_json(args.inner)
    if args.steps is None:
        args.steps = 3 if args.quick else 10
    if args.paired_rounds is None:
        args.paired_rounds = 0 if args.quick else 25
    if args.compile_rounds is None:
        args.compile_rounds = (
            2 if args.inner == "inductor" and args.device == "cpu" and args.compile_loss and not args.quick else 0
        )
    if args.compile_rounds and (args.inner != "inductor" or args.device != "cpu" or not args.compile_loss):
        parser.error(
            "--compile-rounds: the re-timing compiles the model with its loss, with inductor on CPU; give 0 with "
            "other settings"
        )
    if args.paired_rounds and args.paired_rounds < 3:
        parser.error(f"--paired-rounds {args.paired_rounds}: give at least 3 (quartiles need them), or 0 to skip")
    if args.device not in ("cpu", "cuda"):
        parser.error(f"--device {args.device}: choose cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this torch sees no CUDA device")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1 (the first warm-up step compiles)")
    return args


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows of every selected model (a failing row is recorded with its error), and each workload's description."""
    results, shapes = [], {}
    rows.warm_up_compiler(args.inner, args.device)
    for name in args.models:
        factory, batches = WORKLOADS[name]
        workload = on_device(factory(batches[1 if args.quick else 0], seed=args.seed), args.device)
        shapes[name] = workload.shape
        print(f"== {workload.shape}", flush=True)
        ref = rows.reference(workload, args.seed)
        peaks: dict[str, int] = {}  # row name -> its measured peak, for the "remat bytes = ..." rows
        for spec in rows.row_specs(args.inner):
            if not spec.selected(args.rows):
                continue
            if spec.budget_from is not None:
                if spec.budget_from not in peaks:
                    print(f"   {spec.name}: skipped (needs the row {spec.budget_from})", flush=True)
                    continue
                spec = dataclasses.replace(spec, budget=peaks[spec.budget_from])
            print(f"   {spec.name} ...", end=" ", flush=True)
            try:
                row = rows.measure_row(
                    spec,
                    workload,
                    inner=args.inner,
                    seed=args.seed,
                    warmup=args.warmup,
                    steps=args.steps,
                    ref=ref,
                    fallback_random=args.fallback_random,
                    compile_loss=args.compile_loss,
                    fresh_cache=args.fresh_cache,
                )
            except Exception as exc:  # one broken configuration must not cost the other rows
                traceback.print_exc()
                row = {
                    "model": workload.name,
                    "row": spec.name,
                    "kind": spec.kind,
                    "budget": spec.budget,
                    "budget_kind": rows.budget_kind(spec),
                    "error": f"{type(exc).__name__}: {exc}",
                }
                print("error", flush=True)
            else:
                print(f"{row['step_ms']:.1f} ms, peak {row['measured_peak_bytes'] / rows.MiB:.1f} MiB", flush=True)
                peaks[spec.name] = row["measured_peak_bytes"]
            results.append(row)
        if args.paired_rounds and any(r.get("kind") == "remat" for r in results if r["model"] == workload.name):
            time_in_pairs(args, workload, peaks, [r for r in results if r["model"] == workload.name])
        if args.compile_rounds:
            retime_compiles(args, name, [r for r in results if r["model"] == workload.name])
    return report.with_ratios(results), shapes


def retime_compiles(args: argparse.Namespace, model: str, measured: list[dict]) -> None:
    """compile_time.recheck of the model's rows; each re-timed row gets ``compile_recheck``, or every remat row
    ``compile_recheck_error``."""
    print(f"   first steps re-timed in fresh processes, {args.compile_rounds} rounds ...", end=" ", flush=True)
    try:
        found = compile_time.recheck(
            model, measured, time_checks.COMPILE_SLACK, args.compile_rounds, fallback_random=args.fallback_random
        )
    except Exception as exc:  # the single first steps stand without it
        _failed(measured, "compile_recheck_error", exc)
        return
    for r in measured:
        if r["row"] in found:
            r["compile_recheck"] = found[r["row"]]
    print(", ".join(f"{name} {f['ratio']:.2f}x" for name, f in found.items()), flush=True)


def _failed(measured: list[dict], field: str, exc: Exception) -> None:
    """A pass run after the model's rows failed: its traceback printed, the error in each remat row's `field`."""
    traceback.print_exc()
    for r in measured:
        if r.get("kind") == "remat":
            r[field] = f"{type(exc).__name__}: {exc}"
    print("error", flush=True)


PAIRED_FIELDS = (
    "against",
    "step_ms",
    "against_step_ms",
    "ratio",
    "ratio_of_medians",
    "round_ratio_quartiles",
    "rounds",
    "limit",
    "plain_vs_itself",
)


def time_in_pairs(args: argparse.Namespace, workload: Any, peaks: dict[str, int], measured: list[dict]) -> None:
    """The step-time checks' pairs of one model timed in alternation (pairs.py), each remat row of a pair rebuilt
    as measured above (the recipe rows' peaks are its budgets); the result goes into that row as ``paired``, or
    ``paired_error``."""
    by_name = {r["row"]: r for r in measured}
    print(f"   step-time pairs, {args.paired_rounds} rounds each ...", end=" ", flush=True)
    try:
        found = pairs.check_pairs(
            workload,
            args.paired_rounds,
            args.warmup,
            args.inner,
            budget_of=lambda hand: peaks.get(hand.spec.name) or hand.peak(),
            fallback_random=args.fallback_random,
            compile_loss=args.compile_loss,
        )
    except Exception as exc:  # the rows stand without it; the checks then compare the separate stretches
        _failed(measured, "paired_error", exc)
        return
    for p in found:
        row = by_name.get(p["row"])
        if row is not None and "error" not in row:
            row["paired"] = {k: p[k] for k in PAIRED_FIELDS if k in p}
    print(", ".join(f"{p['row']} {p['ratio']:.3f}x" for p in found), flush=True)


def metadata(args: argparse.Namespace, shapes: dict[str, str], argv: list[str]) -> dict[str, Any]:
    """Where and how the numbers were taken."""
    return {
        "command": shlex.join(["python", "benchmarks/run.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "git_commit": _git_commit(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "inner": args.inner,
        "device": args.device,
        "quick": args.quick,
        "steps": args.steps,
        "warmup": args.warmup,
        "fallback_random": args.fallback_random and args.inner == "inductor",
        "fresh_compile_cache": args.fresh_cache and args.inner == "inductor",
        "compiler_warmed_up": True,
        "loss_compiled": args.compile_loss,
        "workloads": shapes,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results, shapes = run(args)
    meta = metadata(args, shapes, argv)
    meta["solvers"] = solver_gaps.compare(args) if args.solvers else {}
    report_path = args.report or report.default_report_path(args.out)
    md_path = report.write(args.out, results, meta, report_path)
    print()
    headline_path = report.derived(args.out, "headline.md")
    print((headline_path if args.headline else md_path).read_text())
    written = [args.out, md_path, headline_path, report.derived(args.out, "pareto.png"), report_path]
    print("wrote " + ", ".join(str(p) for p in written if p.exists()))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
