"""Does `remat.peak_memory`'s event replay agree with the CUDA caching allocator's own peak on eager training steps?

    python benchmarks/cuda_peak_check.py [--models gpt,gpt2,llama] [--batch 8] [--out results/cuda-peak-check.json]

For each model, an eager training step (plain, and under per-block `torch.utils.checkpoint`) is measured four ways
after one warm-up step, parameter gradients set to None before each:

- ``replay``: `remat.peak_memory(step, exclude=<parameter gradients>)`, the figure the benchmark rows report;
- ``replay_all``: `remat.peak_memory` over the same events with nothing excluded;
- ``profiler_replay_all``: the torch.profiler's memory events replayed, nothing excluded (what `peak_memory` with
  `exclude` replayed on CUDA before it read the allocator's own trace);
- ``allocator``: `remat.peak_memory` without `exclude` (`torch.cuda.max_memory_allocated` minus `memory_allocated`
  before the step), gradients included; CUDA only.

The allocator's figure bounds the truth from both sides: the true peak without gradients lies between
``allocator - gradient bytes`` and ``allocator``, and ``replay_all`` should equal ``allocator``. The event stream's
counts are printed too: frees of addresses the window never allocated (memory from before the step) and
allocations at an address still live in the replay (a free the profiler did not see).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402

import remat  # noqa: E402
from remat import measure  # noqa: E402
from rows import RowSpec, build  # noqa: E402
from workloads import WORKLOADS, on_device  # noqa: E402

MIB = 2**20


def event_counts(step, device: torch.device) -> dict[str, int]:
    events = measure._profiler_events(step, (), {}, device)
    live: set[int] = set()
    unseen_free = reused_live = 0
    for _, address, nbytes in events:
        if nbytes > 0:
            reused_live += address in live
            live.add(address)
        elif address in live:
            live.discard(address)
        else:
            unseen_free += 1
    allocs = sum(1 for e in events if e[2] > 0)
    return {
        "allocations": allocs,
        "frees": len(events) - allocs,
        "frees_unseen": unseen_free,
        "alloc_at_live": reused_live,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check(name: str, recipe: str, batch: int, device_name: str) -> dict:
    factory, _ = WORKLOADS[name]
    workload = on_device(factory(batch), device_name)
    model = copy.deepcopy(workload.model)
    if recipe == "none":
        spec = RowSpec("eager", "eager", "eager")
    else:
        spec = RowSpec(f"eager+{recipe}", "checkpoint", "eager", recipe=recipe)
    forward = build(spec, model, "inductor", workload, compile_loss=True)
    params = list(model.parameters())
    device = workload.inputs[0].device

    def step() -> None:
        forward(*workload.inputs).backward()
        sync(device)

    def measured(how):
        for p in params:
            p.grad = None  # freed before the window: a free inside it would offset the allocator's figure
        return how()

    step()
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    replay = measured(lambda: remat.peak_memory(step, device=device, exclude=lambda: [p.grad for p in params]))
    replay_all = measured(lambda: remat.peak_memory(step, device=device, exclude=lambda: []))
    profiler = measured(lambda: measure._replay(measure._profiler_events(step, (), {}, device), set()))
    # peak_memory without exclude on CUDA: max_memory_allocated over the step, above what was allocated before it
    allocator = measured(lambda: remat.peak_memory(step, device=device)) if device.type == "cuda" else None
    row = {
        "model": name,
        "row": spec.name,
        "replay_mib": replay / MIB,
        "replay_all_mib": replay_all / MIB,
        "profiler_replay_all_mib": profiler / MIB,
        "allocator_mib": None if allocator is None else allocator / MIB,
        "grad_mib": grad_bytes / MIB,
        **measured(lambda: event_counts(step, device)),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,gpt2,llama")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=str(HERE / "results" / "cuda-peak-check.json"))
    args = parser.parse_args()
    rows = [check(m, r, args.batch, args.device) for m in args.models.split(",") for r in ("none", "per-block")]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    meta = {"torch": torch.__version__, "device": device}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
