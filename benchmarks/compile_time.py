"""Compile time from a cold start: plain `torch.compile` (inductor) against remat, each row in a process of its own.

    python benchmarks/compile_time.py [--models gpt,mlp,gpt2,llama] [--budgets None,0.5,0.0] [--repeat 3]
                                      [--out benchmarks/results/compile_time.json] [--md benchmarks/COMPILE_TIME.md]

Each row (a model under plain inductor, or under remat at one memory_budget) runs in a fresh Python process with an
empty inductor cache directory (TORCHINDUCTOR_CACHE_DIR), the FX graph cache off and one compile thread, so no row
reuses kernels another row built and every kernel is compiled by the row that needs it. The process first compiles
and runs a tiny function (imports and compiler start-up, paid once per process, are not a row's compile time), then
times the model's first forward+backward step: compilation of the forward and backward graphs plus one step.

Two figures per row:
- wall seconds of that first step;
- CPU seconds: the process's own CPU time plus that of the compiler processes it waited for (gcc), so the figure holds
  when other jobs share the machine (wall time then includes waiting for a core).
For remat rows, the CPU seconds spent planning (`remat.pipeline.plan_joint`: capture, costs, the baseline partition,
the solver, the simulation) are shown apart. The check (issue 12): remat's CPU seconds ≤ 1.5 × plain inductor's on
every model, at every budget.

run.py calls `recheck` after each model's rows: the slowest remat row of the report, and any whose single first step
took over the limit, re-timed against plain inductor in fresh processes and rounds like these, with the report's
thread counts and its wall-time figure (`--compile-rounds`).

One cold compile varies by a fifth or more between runs here (gcc and the machine's other jobs), more than the
margins compared. So each model's rows run `--repeat` times, in rounds (every row of the model once per round, in
turn, so that a slower stretch of the machine falls on all of them alike); a row's figures are the medians of its
runs, its spread the fastest and slowest run's CPU seconds, and the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import outputs  # benchmarks/, the script's own folder

HERE = Path(__file__).resolve().parent
LIMIT = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt,mlp,gpt2,llama", help="comma-separated (default: %(default)s)")
    parser.add_argument("--budgets", default="None,0.5,0.0", help="remat memory_budget values (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each row, in rounds (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "compile_time.json")
    parser.add_argument("--md", type=Path, default=HERE / "COMPILE_TIME.md")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ROW"), help=argparse.SUPPRESS)
    parser.add_argument("--child-own-random", action="store_true", help=argparse.SUPPRESS)  # inductor's own RNG
    parser.add_argument("--child-threads", action="store_true", help=argparse.SUPPRESS)  # torch's own thread counts
    return parser.parse_args(argv)


def _cpu_seconds() -> float:
    """CPU time of this process and of the child processes it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def child(model: str, row: str, fallback_random: bool = True, one_thread: bool = True) -> dict:
    """One row, in this (fresh) process: the first step's wall and CPU seconds, and remat's planning CPU seconds."""
    sys.path[:0] = [str(HERE.parent), str(HERE)]
    import torch

    import remat.backend
    from rows import _WithLoss
    from workloads import WORKLOADS

    if one_thread:
        torch.set_num_threads(1)
    factory, batches = WORKLOADS[model]
    workload = factory(batches[0], seed=0)

    planning = [0.0]
    plan_joint = remat.backend.plan_joint

    def timed_plan_joint(*args, **kwargs):
        start = time.process_time()
        try:
            return plan_joint(*args, **kwargs)
        finally:
            planning[0] += time.process_time() - start

    remat.backend.plan_joint = timed_plan_joint  # this process only: it exits after the row

    warm = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda t: (t.sin() @ t).sum(), backend="inductor")(warm).backward()
    torch._dynamo.reset()

    backend, options = backend_of(row)
    compiled = torch.compile(_WithLoss(workload.model, workload.loss_fn), backend=backend, options=options)
    with torch._inductor.config.patch(fallback_random=fallback_random):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        compiled(*workload.inputs).backward()
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - start_cpu
    return {"model": model, "row": row, "wall_seconds": wall, "cpu_seconds": cpu, "plan_cpu_seconds": planning[0]}


def backend_of(row: str) -> tuple[str, dict | None]:
    """The backend and options of a row: "inductor" (plain), a memory_budget ("None" or a fraction), or a JSON
    object of remat options (run.py's re-timing of a report row: a byte budget, contiguous=True, ...)."""
    if row == "inductor":
        return "inductor", None
    if row.startswith("{"):
        return "remat", {"inner": "inductor", **json.loads(row)}
    return "remat", {"memory_budget": None if row == "None" else float(row), "inner": "inductor"}


def run_row(model: str, row: str, fallback_random: bool = True, one_thread: bool = True) -> dict:
    """One row in a fresh process with an empty inductor cache; `one_thread`: one torch thread and one compile
    thread (else torch's and inductor's own choices, as run.py's rows compile)."""
    with tempfile.TemporaryDirectory(prefix="remat-compile-time-") as cache:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=cache,
            TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        )
        if one_thread:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        flags = [*([] if fallback_random else ["--child-own-random"]), *([] if one_thread else ["--child-threads"])]
        done = subprocess.run(
            [sys.executable, __file__, "--child", model, row, *flags],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{model} {row}: exit {done.returncode}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def remat_key(row: dict) -> str:
    """A report row (run.py) as this script's row: its remat options as a JSON object (budget in bytes once
    resolved, or the fraction; contiguous, offload)."""
    return json.dumps({"memory_budget": row.get("budget"), **row.get("options", {})}, sort_keys=True)


def recheck(
    model: str, rows: list[dict], limit: float, rounds: int, fallback_random: bool = True, run=None
) -> dict[str, dict]:
    """Re-time the first step of a model's remat report rows that look slow — the slowest one and any whose single
    first step took over `limit` × the plain row's — against plain inductor: each run a fresh process with an empty
    inductor cache, as above, but with torch's and inductor's own thread counts (as the report's rows compile), and
    its wall seconds the figure (the report's column); `rounds` rounds of all of them in turn, the order reversed
    every other round, so a slower stretch of the machine falls on all alike. Per re-timed row name: its and plain
    inductor's median seconds, their ratio, every run. `run`: run_row, or a stand-in in tests."""
    run = run or run_row
    plain = next((r for r in rows if r.get("kind") == "compiled" and r.get("first_step_s")), None)
    timed = [r for r in rows if r.get("kind") == "remat" and "error" not in r and r.get("first_step_s")]
    if plain is None or not timed or rounds < 1:
        return {}
    slowest = max(timed, key=lambda r: r["first_step_s"])
    picked = [r for r in timed if r is slowest or r["first_step_s"] > limit * plain["first_step_s"]]
    keys = {"inductor": "inductor", **{r["row"]: remat_key(r) for r in picked}}
    seconds: dict[str, list[float]] = {name: [] for name in keys}
    for n in range(rounds):
        for name in keys if n % 2 == 0 else reversed(keys):
            seconds[name].append(run(model, keys[name], fallback_random, one_thread=False)["wall_seconds"])
    median = {name: statistics.median(runs) for name, runs in seconds.items()}
    return {
        r["row"]: {
            "seconds": median[r["row"]],
            "plain_seconds": median["inductor"],
            "ratio": median[r["row"]] / median["inductor"],
            "rounds": rounds,
            "seconds_all": seconds[r["row"]],
            "plain_seconds_all": seconds["inductor"],
        }
        for r in picked
    }


def medians(runs: list[dict]) -> dict:
    """One row's figures over its runs: the median of each, and every run's CPU seconds."""
    row = {key: runs[0][key] for key in ("model", "row")}
    for key in ("wall_seconds", "cpu_seconds", "plan_cpu_seconds"):
        row[key] = statistics.median(r[key] for r in runs)
    row["runs"] = [r["cpu_seconds"] for r in runs]
    return row


def table(rows: list[dict]) -> str:
    plain = {r["model"]: r for r in rows if r["row"] == "inductor"}
    lines = [
        "| model | row | runs | first step wall s | CPU s | CPU s fastest–slowest | of which planning | "
        "CPU vs plain inductor |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        ratio = r["cpu_seconds"] / plain[r["model"]]["cpu_seconds"] if r["model"] in plain else float("nan")
        name = "plain inductor" if r["row"] == "inductor" else f"remat memory_budget={r['row']}"
        planning = "-" if r["row"] == "inductor" else f"{r['plan_cpu_seconds']:.2f}"
        lines.append(
            f"| {r['model']} | {name} | {len(r['runs'])} | {r['wall_seconds']:.2f} | {r['cpu_seconds']:.2f} | "
            f"{min(r['runs']):.1f}–{max(r['runs']):.1f} | {planning} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    plain = {r["model"]: r["cpu_seconds"] for r in rows if r["row"] == "inductor"}
    out = []
    for model, base in plain.items():
        worst = max((r for r in rows if r["model"] == model and r["row"] != "inductor"), key=lambda r: r["cpu_seconds"])
        ratio = worst["cpu_seconds"] / base
        out.append(
            f"{'PASS' if ratio <= LIMIT else 'FAIL'}: {model}: slowest remat row (memory_budget={worst['row']}) "
            f"{worst['cpu_seconds']:.1f} s CPU vs plain inductor {base:.1f} s ({ratio:.2f}x, limit {LIMIT}x)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(
            json.dumps(child(*args.child, fallback_random=not args.child_own_random, one_thread=not args.child_threads))
        )
        return 0
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {args.repeat}")
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        names = ["inductor", *[b for b in args.budgets.split(",") if b]]
        runs: dict[str, list[dict]] = {row: [] for row in names}
        for _ in range(args.repeat):
            for row in names:
                r = run_row(model, row)
                runs[row].append(r)
                print(
                    f"{model} {row}: {r['wall_seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU "
                    f"(planning {r['plan_cpu_seconds']:.1f} s)",
                    flush=True,
                )
        rows += [medians(runs[row]) for row in names]
    lines = verdicts(rows)
    meta = outputs.machine(sys.argv[1:] if argv is None else argv)
    intro = (
        f"{outputs.setup('compile_time.py', meta)} Each run is a fresh process with an empty inductor cache, one "
        "compile thread and one torch thread; the figures are the model's first forward+backward step (both graphs "
        "compiled, one step run). CPU s counts the compiler processes (gcc) too, and is the figure compared (the "
        f"machine is shared). Each row ran {args.repeat} times, in rounds over the model's rows; its figures are the "
        "medians, the ratio is of the medians."
    )
    payload = {"meta": meta, "rows": rows, "verdicts": lines}
    outputs.write(args.out, args.md, payload, "Compile time from a cold start", intro, table(rows), lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
