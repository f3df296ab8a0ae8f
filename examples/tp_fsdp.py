"""A GPT-style training step under FSDP2 and tensor parallelism, compiled with backend="remat" at a byte budget.

    torchrun --nproc_per_node 2 examples/tp_fsdp.py                # mesh 1x2: 1 data-parallel x 2 tensor-parallel
    torchrun --nproc_per_node 2 examples/tp_fsdp.py --mesh 2x1     # 2 data-parallel ranks, each with its own batch
    torchrun --nproc_per_node 2 examples/tp_fsdp.py --small        # the short configuration CI runs

The MLP of every block is tensor-parallel (first Linear column-wise, second row-wise, over the mesh's "tp"
dimension); attention stays replicated, as remat.zoo's GPT projects q, k and v with one fused Linear. Every block and
the root are sharded with FSDP2 `fully_shard` over the "dp" dimension. On CPU the ranks talk over gloo and remat's
inner compiler is aot_eager; with CUDA, NCCL and inductor. Each rank prints the plans remat made for its graphs and
the measured peak activation memory of a step (parameter gradients left out, as the budget counts them).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import remat
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch


class Step(torch.nn.Module):
    """The model and its loss, compiled together so the loss's activations are planned too."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return gpt_loss(self.model, idx, targets)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh", default="1x2", help="data-parallel x tensor-parallel ranks, e.g. 1x2 or 2x1")
    parser.add_argument("--budget", default=None, help='memory_budget, e.g. "4MiB" (default: by configuration)')
    parser.add_argument("--small", action="store_true", help="a 2-layer d64 model on 32 tokens (for CI)")
    return parser.parse_args()


def build(mesh, config: GPTConfig, device: torch.device) -> GPT:
    model = GPT(config, seed=0).to(device)  # the same weights on every rank, then sharded
    for block in model.blocks:
        parallelize_module(block.mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def train_step(step, params, batch):
    for p in params:
        p.grad = None
    loss = step(*batch)
    loss.backward()
    return loss


def report(rank: int, lines: list[str]) -> None:
    """Print each rank's lines in rank order."""
    for r in range(dist.get_world_size()):
        if r == rank:
            print("\n".join(lines), flush=True)
        dist.barrier()


def main() -> None:
    args = parse()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dp, tp = (int(n) for n in args.mesh.split("x"))
    if dp * tp != dist.get_world_size():
        raise SystemExit(f"--mesh {args.mesh}: {dp * tp} ranks, but torchrun started {dist.get_world_size()}")
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    config = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=256) if args.small else GPTConfig()
    budget = args.budget or ("1536KiB" if args.small else "48MiB")
    device = torch.device("cuda" if cuda else "cpu")
    model = build(mesh, config, device)
    options = {"memory_budget": budget, "inner": "inductor" if cuda else "aot_eager"}
    step = torch.compile(Step(model), backend="remat", options=options)
    # Each data-parallel rank its own batch; the tensor-parallel ranks of one data-parallel rank share it.
    batch = [t.to(device) for t in make_gpt_batch(config, batch=4, seed=mesh.get_local_rank("dp"))]
    params = list(model.parameters())
    # One seed on every rank: the tensor-parallel ranks draw the same dropout masks on their replicated activations.
    torch.manual_seed(1234)

    loss = train_step(step, params, batch)  # compiles
    plans = remat.recent_plans()
    peak = remat.peak_memory(train_step, step, params, batch, exclude=lambda: [p.grad for p in params])
    coords = f"dp {mesh.get_local_rank('dp')}/{dp}, tp {mesh.get_local_rank('tp')}/{tp}"
    lines = [f"rank {rank} ({coords}): loss {loss.item():.4f}, memory_budget {budget}, {len(plans)} graph(s)"]
    lines += [f"  graph {i}: {plan.summary()}" for i, plan in enumerate(plans)]
    lines.append(f"  measured peak of a step: {peak / 2**20:.2f} MiB (parameter gradients left out)")
    report(rank, lines)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
