"""remat.checkpointing across a 2-rank gloo group on CPU: partitioned activations, contiguous buffers, seeds.

One spawn runs every scenario on both ranks (starting processes is the slow part); each scenario records its
measurements or its error, and the tests below check them one by one.
"""

from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.distributed as dist
from torch import nn
from ranks import TIMEOUT, run as run_ranks

WORLD = 2
pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is not available"
)


class GlooMPU:
    """The model-parallel unit of a job whose model-parallel group is the whole world."""

    def get_model_parallel_rank(self):
        return dist.get_rank()

    def get_model_parallel_world_size(self):
        return dist.get_world_size()

    def get_model_parallel_group(self):
        return dist.group.WORLD


def _layers(n=4, width=16, dropout=0.0):
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Dropout(dropout)) for _ in range(n))


def _step(layers, x, checkpointed):
    from remat import checkpointing

    for p in layers.parameters():
        p.grad = None
    x = x.detach().requires_grad_(True)
    torch.manual_seed(5)
    h = x
    for layer in layers:
        h = checkpointing.checkpoint(layer, h) if checkpointed else layer(h)
    h.square().sum().backward()
    return [h.detach(), x.grad] + [p.grad.clone() for p in layers.parameters()]


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _partition_4x4(rank):
    from remat import checkpointing
    from remat.eager import region

    checkpointing.configure(GlooMPU(), partition_activations=True, profile=True)
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(4, 4, requires_grad=True)
    out = checkpointing.checkpoint(lambda t: torch.tanh(lin(t)) * t, x)
    kept = [t for r in region.live_regions() for t in r.stash.kept_tensors()]
    got = [out.detach()]
    out.sum().backward()
    got += [x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    x.grad = lin.weight.grad = lin.bias.grad = None
    ref = torch.tanh(lin(x)) * x
    want = [ref.detach()]
    ref.sum().backward()
    want += [x.grad, lin.weight.grad, lin.bias.grad]
    step = checkpointing.get_profile().steps[-1]
    return {
        "kept_numel": [t.numel() for t in kept],
        "kept_is_my_half": len(kept) == 1 and torch.equal(kept[0], x.detach().reshape(-1)[rank * 8 : rank * 8 + 8]),
        "equal": _equal(got, want),
        "gathers": step.calls["gather"],
    }


def _contiguous_partition(rank):
    from remat import checkpointing
    from remat.runtime import buffers

    checkpointing.configure(GlooMPU(), partition_activations=True, contiguous_checkpointing=True, num_checkpoints=4)
    layers = _layers()
    x = torch.randn(4, 16)
    want = _step(layers, x, checkpointed=False)
    start, reuses = buffers.POOL.stats.allocations, buffers.POOL.stats.reuses
    equal = [_equal(_step(layers, x, checkpointed=True), want) for _ in range(3)]
    return {
        "equal": equal,
        "allocations": buffers.POOL.stats.allocations - start,
        "reuses": buffers.POOL.stats.reuses - reuses,
    }


def _eval_then_reset(rank):
    from remat import checkpointing

    checkpointing.configure(GlooMPU(), partition_activations=True, contiguous_checkpointing=True, num_checkpoints=4)
    layers = _layers(dropout=0.1)
    x = torch.randn(4, 16)
    want = _step(layers, x, checkpointed=False)
    layers.eval()
    kept = []
    for _ in range(3):
        h = x.requires_grad_(True)
        for layer in layers:
            h = checkpointing.checkpoint(layer, h)
        kept.append(h)
    del kept
    checkpointing.reset()
    layers.train()
    return {"equal": [_equal(_step(layers, x, checkpointed=True), want) for _ in range(2)]}


def _offload_partition(rank):
    from remat import checkpointing

    checkpointing.configure(GlooMPU(), partition_activations=True, checkpoint_in_cpu=True)
    layers = _layers(dropout=0.2)
    x = torch.randn(4, 16)
    return {"equal": _equal(_step(layers, x, checkpointed=True), _step(layers, x, checkpointed=False))}


def _seeds(rank):
    from remat import checkpointing

    from remat.runtime import rng

    checkpointing.configure(GlooMPU())
    checkpointing.model_parallel_cuda_manual_seed(42)
    device = rng.default_device()  # the tracker's: the current CUDA device, else the CPU
    with checkpointing.get_cuda_rng_tracker().fork():
        parallel = torch.rand(6, device=device)
    return {"parallel": parallel.cpu(), "default": torch.rand(6, device=device).cpu()}


def _rank_dependent_input(rank):
    """Each rank checkpoints its own data (data parallelism) with partition_activations over the world: the shards
    would gather into a mix of both ranks' inputs, so the first call raises on both ranks, naming the input."""
    import remat
    from remat import checkpointing

    checkpointing.configure(GlooMPU(), partition_activations=True)
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    torch.manual_seed(100 + rank)
    x = torch.randn(4, 4, requires_grad=True)

    def block(t):
        return torch.tanh(lin(t))

    try:
        checkpointing.checkpoint(block, x).sum().backward()
    except remat.PartitionMismatch as exc:
        return {"raised": str(exc)}
    finally:
        checkpointing.reset()
    return {"raised": ""}


SCENARIOS = {
    f.__name__.lstrip("_"): f
    for f in (
        _partition_4x4,
        _contiguous_partition,
        _eval_then_reset,
        _offload_partition,
        _seeds,
        _rank_dependent_input,
    )
}


def _worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=TIMEOUT)
    results = {}
    try:
        for name, scenario in SCENARIOS.items():
            try:
                results[name] = scenario(rank)
            except Exception:  # recorded, so one failing scenario does not hide the others
                results[name] = {"error": traceback.format_exc()}
            dist.barrier()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo")
    run_ranks(_worker, str(out / "init"), str(out), world=WORLD)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _scenario(ranks, name):
    per_rank = [r[name] for r in ranks]
    for rank, result in enumerate(per_rank):
        assert "error" not in result, f"rank {rank}:\n{result.get('error')}"
    return per_rank


def test_partition_keeps_half_of_a_4x4_input_per_rank(ranks):
    for result in _scenario(ranks, "partition_4x4"):
        assert result["kept_numel"] == [8] and result["kept_is_my_half"]
        assert result["equal"], "outputs and gradients equal the unpartitioned model's"
        assert result["gathers"] == 1


def test_contiguous_partition_parity_and_buffers_reused(ranks):
    for result in _scenario(ranks, "contiguous_partition"):
        assert result["equal"] == [True, True, True]
        assert result["allocations"] == 4, "num_checkpoints arenas, allocated once"
        assert result["reuses"] == 12, "every later store is served by an existing arena"


def test_eval_forwards_without_backward_then_reset_and_train(ranks):
    for result in _scenario(ranks, "eval_then_reset"):
        assert result["equal"] == [True, True]


def test_offload_with_partition_parity(ranks):
    for result in _scenario(ranks, "offload_partition"):
        assert result["equal"]


def test_model_parallel_seed_differs_across_ranks(ranks):
    first, second = _scenario(ranks, "seeds")
    assert not torch.equal(first["parallel"], second["parallel"])
    assert torch.equal(first["default"], second["default"])


def test_partition_of_rank_dependent_inputs_raises_on_every_rank(ranks):
    for result in _scenario(ranks, "rank_dependent_input"):
        message = result["raised"]
        assert "input 0 of _rank_dependent_input.<locals>.block" in message, message
        assert "model-parallel group" in message and "data-parallel" in message
