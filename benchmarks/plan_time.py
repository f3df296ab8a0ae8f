"""Planning time on a ~10k-node joint graph: capture → cost → annotate → plan (`plan_joint`), no compile.

    python benchmarks/plan_time.py [--layers 385] [--repeat 3] [--solvers greedy,mincut,auto]
                                   [--fractions 0.5,0.0] [--out benchmarks/results/plan_time.json] [--profile]

The joint graph of `tests/random_graphs.synthetic_chain(layers)` is captured once (not timed); each (solver, budget)
is then planned `--repeat` times and the best wall and CPU times kept (CPU time is the one to read when other jobs
share the machine). Prints a markdown table and writes JSON to --out.
--profile also prints the top of a cProfile (sorted by cumulative time) of one plan per row and the best time of each
stage on its own (capture, costs, annotate, build_problem, each solver's family, one simulate). Target: ≤ 1 s for
greedy and mincut.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # the checkout's remat and the test models

import torch  # noqa: E402

from random_graphs import synthetic_chain  # noqa: E402
from remat.annotate import annotate  # noqa: E402
from remat.capture import capture  # noqa: E402
from remat.config import RematConfig  # noqa: E402
from remat.cost import costs  # noqa: E402
from remat.explain import capture_joints  # noqa: E402
from remat.pipeline import plan_joint  # noqa: E402
from remat.plan import greedy, mincut  # noqa: E402
from remat.plan.evaluate import Evaluator  # noqa: E402
from remat.plan.problem import build_problem  # noqa: E402
from remat.plan.simulate import simulate  # noqa: E402

TARGET_SECONDS = {"greedy": 1.0, "mincut": 1.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=385,
                        help="synthetic_chain depth (default %(default)s: 10,017 nodes)")
    parser.add_argument("--repeat", type=int, default=3, help="timed plans per row; the best is kept")
    parser.add_argument("--solvers", default="greedy,mincut,auto", help="comma-separated (default: %(default)s)")
    parser.add_argument("--fractions", default="0.5,0.0", help="memory_budget fractions (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "plan_time.json")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of one plan per row and the CPU time of each stage")
    args = parser.parse_args(argv)
    args.solvers = [s for s in args.solvers.split(",") if s]
    args.fractions = [float(f) for f in args.fractions.split(",") if f]
    return args


def plan_once(captured, config: RematConfig):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an infeasible budget warns; the time is what is measured here
        return plan_joint(captured.joint, captured.num_fwd_outputs, config)


def best_time(captured, config: RematConfig, repeat: int) -> tuple[float, float, object]:
    """Best wall and best CPU seconds of `repeat` plans. CPU time is what to compare when other jobs share the
    machine (wall time then includes waiting for a core)."""
    wall, cpu, planned = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        planned = plan_once(captured, config)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, planned


def stages(captured, repeat: int) -> dict[str, float]:
    """Best-of-`repeat` CPU seconds of each stage plan_joint runs (the same calls, one at a time), and of the parts
    of the solvers: a heuristic family is what make_plan spends nearly all its time on."""
    def best(fn):
        times = []
        for _ in range(repeat):
            start = time.process_time()
            out = fn()
            times.append(time.process_time() - start)
        return min(times), out

    joint, n_out = captured.joint, captured.num_fwd_outputs
    seconds: dict[str, float] = {}
    seconds["capture"], graph = best(lambda: capture(joint, n_out))
    seconds["costs"], table = best(lambda: costs(joint, graph))
    seconds["annotate"], constraints = best(lambda: annotate(joint, graph, table))
    seconds["build_problem"], problem = best(lambda: build_problem(graph, table, constraints))
    seconds["greedy.family"], members = best(lambda: greedy.family(problem, Evaluator(problem)))
    seconds["greedy.members"] = len(members)
    seconds["mincut.family"], members = best(lambda: mincut.family(problem, Evaluator(problem)))
    seconds["mincut.members"] = len(members)
    resolved = problem.resolve(problem.choosable[: len(problem.choosable) // 2])
    seconds["resolve (one)"], _ = best(lambda: problem.resolve(problem.choosable[: len(problem.choosable) // 2]))
    seconds["simulate (one)"], _ = best(lambda: simulate(problem, resolved))
    return seconds


def profile(captured, config: RematConfig, top: int = 25) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    plan_once(captured, config)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def table(rows: list[dict]) -> str:
    head = "| solver | budget | nodes | candidates | seconds | CPU seconds | peak MiB (baseline) | recompute MFLOP |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['solver']} | {r['fraction']} | {r['nodes']} | {r['candidates']} | {r['seconds']:.3f} | "
            f"{r['cpu_seconds']:.3f} | "
            f"{r['peak_bytes'] / 2**20:.2f} ({r['baseline_peak_bytes'] / 2**20:.2f}) | "
            f"{r['recompute_flops'] / 1e6:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, inputs = synthetic_chain(args.layers)
    start = time.perf_counter()
    (captured,) = capture_joints(model, *inputs)
    capture_seconds = time.perf_counter() - start
    nodes = len(captured.joint.graph.nodes)
    print(f"synthetic_chain({args.layers}): {nodes} joint-graph nodes, captured in {capture_seconds:.1f} s (not timed)")
    rows = []
    for solver in args.solvers:
        for fraction in args.fractions:
            config = RematConfig(memory_budget=fraction, solver=solver)
            seconds, cpu_seconds, planned = best_time(captured, config, args.repeat)
            plan = planned.plan
            rows.append({
                "solver": solver, "fraction": fraction, "nodes": nodes,
                "candidates": len(planned.problem.candidates), "choosable": len(planned.problem.choosable),
                "seconds": seconds, "cpu_seconds": cpu_seconds, "target_seconds": TARGET_SECONDS.get(solver),
                "peak_bytes": plan.peak_bytes, "baseline_peak_bytes": plan.baseline.peak_bytes,
                "budget_bytes": plan.budget_bytes, "recompute_flops": plan.recompute_flops,
            })
            if args.profile:
                print(f"\n## profile: solver={solver} memory_budget={fraction}\n")
                print(profile(captured, config))
    breakdown = None
    if args.profile:
        breakdown = stages(captured, args.repeat)
        print(f"\n## stages: CPU seconds, best of {args.repeat}, no profiler\n")
        for name, value in breakdown.items():
            print(f"{name:>16}  {value:.3f}" if isinstance(value, float) else f"{name:>16}  {value}")
    print()
    print(table(rows))
    slow = [r for r in rows if r["target_seconds"] is not None and r["seconds"] > r["target_seconds"]]
    for r in slow:
        print(f"over target: {r['solver']} at {r['fraction']}: {r['seconds']:.2f} s > {r['target_seconds']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.platform(),
        "layers": args.layers, "repeat": args.repeat, "capture_seconds": capture_seconds,
    }
    result = {"meta": meta, "rows": rows}
    if breakdown is not None:
        result["stages_seconds"] = breakdown
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
