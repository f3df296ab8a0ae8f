"""The report's solver section: each benchmark model planned by every solver under the same byte budgets, as
`remat.compare_solvers` plans it, in the graph the report's rows compile (run.py --solvers)."""

from __future__ import annotations

import argparse
from typing import Any

import rows
from workloads import WORKLOADS, on_device

import remat


SOLVER_FRACTIONS = (0.5, 0.0)


def compare(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Each model of run.py's `args` planned by mincut, greedy and optimal under the same byte budgets (planning
    only, no training), at the rows' batch size, seed, device and inner compiler, random ops drawn as theirs."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in args.models:
        factory, batches = WORKLOADS[name]
        workload = on_device(factory(batches[1 if args.quick else 0], seed=args.seed), args.device)
        records = []
        for fraction in SOLVER_FRACTIONS:
            try:
                # the graph the rows compile: the same inner compiler, and its random ops as the rows draw them
                with rows.row_context(
                    rows.RowSpec("solvers", "remat", "remat"), args.inner, args.fallback_random, args.fresh_cache
                ):
                    comparison = remat.compare_solvers(
                        lambda *a: workload.loss_fn(workload.model, *a),
                        *workload.inputs,
                        memory_budget=fraction,
                        inner=args.inner,
                        solver_time_limit=20.0,
                    )
            except Exception as exc:  # a failing comparison is reported, not fatal
                records.append({"fraction": fraction, "error": f"{type(exc).__name__}: {exc}"})
                continue
            for rec in comparison.to_records():
                records.append({"fraction": fraction, "budget_bytes": comparison.budget_bytes, **rec})
        out[name] = records
        print(
            f"== solvers {name}: "
            + ", ".join(f"{r['solver']}@{r['fraction']} gap {r.get('gap')}" for r in records if "solver" in r),
            flush=True,
        )
    return out
