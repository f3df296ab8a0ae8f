"""Which ops allocate more than their outputs while they run (scratch), measured one op at a time.

Every op kind in the joint graphs of the benchmark models (as aot_eager traces them, CPU) is run alone on tensors of
the graph's shapes, under `remat.peak_memory`; its scratch is the peak minus the bytes of its outputs. The table
printed (and written as JSON with --out) is what remat's simulation counts as scratch (`remat/plan/arrays.py`).

    python benchmarks/op_scratch.py [--models gpt,gpt2,llama,mlp] [--batch 2] [--out results/op_scratch.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.fx as fx

import remat
from remat.explain import capture_joints

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from workloads import WORKLOADS  # noqa: E402


def _real(value: object) -> object:
    """A real tensor with the fake value's shape, dtype and strides (ids in range, masks boolean)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype.is_floating_point:
        dense = torch.rand(value.shape, dtype=value.dtype) * 0.9 + 0.1
    elif value.dtype == torch.bool:
        dense = torch.rand(value.shape) > 0.5
    else:
        dense = torch.zeros(value.shape, dtype=value.dtype)  # indices: 0 is valid for every embedding and target
    try:
        return (
            dense.as_strided(value.shape, value.stride())
            if dense.is_contiguous() and value.is_contiguous()
            else dense.contiguous()
        )
    except RuntimeError:
        return dense


def _bytes(result: object) -> int:
    leaves = result if isinstance(result, (tuple, list)) else [result]
    seen, total = set(), 0
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def measure(node: fx.Node) -> tuple[int, int] | None:
    """(peak bytes, output bytes) of running the node's op alone, or None when it cannot run alone."""
    args = fx.node.map_arg(node.args, lambda n: _real(n.meta.get("val")))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: _real(n.meta.get("val")))
    holder: list[object] = []
    try:
        peak = remat.peak_memory(lambda: holder.append(node.target(*args, **kwargs)))
    except Exception:
        return None
    return peak, _bytes(holder[0])


def scratch_table(models: list[str], batch: int) -> dict[str, dict[str, int]]:
    """op → the largest scratch measured for it, with the output bytes of that instance."""
    table: dict[str, dict[str, int]] = {}
    for name in models:
        workload = WORKLOADS[name][0](batch)
        for captured in capture_joints(lambda *x, w=workload: w.loss_fn(w.model, *x), *workload.inputs):
            done = set()
            for node in captured.joint.graph.nodes:
                if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                    continue
                key = (str(node.target), str(node.meta.get("val")))
                if key in done:
                    continue
                done.add(key)
                found = measure(node)
                if found is None:
                    continue
                peak, out = found
                op = str(node.target)
                if peak - out > table.get(op, {}).get("scratch", 0):
                    table[op] = {"scratch": peak - out, "output": out}
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt,gpt2,llama,mlp")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    table = scratch_table([m for m in args.models.split(",") if m], args.batch)
    print(f"{'op':60} {'scratch bytes':>14} {'output bytes':>14} {'ratio':>6}")
    for op, row in sorted(table.items(), key=lambda kv: -kv[1]["scratch"]):
        ratio = row["scratch"] / row["output"] if row["output"] else float("inf")
        print(f"{op:60} {row['scratch']:>14} {row['output']:>14} {ratio:>6.2f}")
    if args.out:
        args.out.write_text(json.dumps(table, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
