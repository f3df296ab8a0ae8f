"""partition="world" with two gloo processes on CPU: each rank keeps half of every partitioned value, gradients
equal the single-process run, and ranks that plan differently fail with an error naming the decision."""

import copy
import datetime
import json
import math
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import remat
from ranks import TIMEOUT, report
from remat.plan.agree import check_ranks_agree
from ranks import spawn as spawn_ranks

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def make_model(width=256):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(128, width),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(width, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, 1),
    )


# Odd shapes: 33 rows of 255 features, so each partitioned activation has an odd element count and its two shards
# differ (one holds a zero pad).
ODD = {"width": 255, "batch": 33}


def run_step(module, batch=32, seed=5):
    torch.manual_seed(seed)
    x = torch.randn(batch, 128)
    loss = module(x).sum()
    loss.backward()
    return loss.item(), [p.grad.flatten().tolist() for p in module.parameters()]


def profiled(kind):
    """(calls, bytes) of `kind` in the last plan's runtime profile."""
    step = remat.last_plan().profile.steps[-1]
    return step.calls[kind], step.bytes[kind]


def run_mode(rank, mode):
    """One compile and step of `mode` on this rank: its loss, gradients and plan, or the error it raised."""
    options = {"inner": "aot_eager", "partition": "world"}
    shape = ODD if mode == "odd" else {}
    if mode == "odd":  # every stage checks its invariants; the runtime ops record what they move
        options.update(debug=True, profile=True)
    if mode == "mismatch":  # a policy that depends on the rank: the ranks' plans differ
        options["policy"] = lambda node: remat.Action.RECOMPUTE if rank == 1 and "tanh" in node.op else None
    if mode == "debug":  # the ranks compare partitioned values on every call, not only the first
        options["debug"] = True
    compiled = torch.compile(make_model(shape.get("width", 256)), backend="remat", options=options)
    try:
        if mode == "debug":
            run_step(compiled)  # the same batch on both ranks: the values agree
        # each rank its own batch (data parallelism): from the first call on, or (debug) on the second
        seed = 5 + rank if mode in ("debug", "data_parallel") else 5
        loss, grads = run_step(compiled, shape.get("batch", 32), seed)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
        return {"error": f"{type(exc).__name__}: {exc}"}
    plan = remat.last_plan()
    result = {
        "loss": loss,
        "grads": grads,
        "fingerprint": plan.fingerprint(),
        "partitioned": [(d.name, d.nbytes, d.kept) for d in plan.decisions if d.action is remat.Action.PARTITION],
    }
    if mode == "odd":
        result["partitioned_shapes"] = [
            (list(d.shape), d.dtype) for d in plan.decisions if d.action is remat.Action.PARTITION
        ]
        result["shard"], result["gather"] = profiled("shard"), profiled("gather")
    return result


def worker(rank, world, init, out, modes):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        results = {}
        for mode in modes:
            results[mode] = run_mode(rank, mode)
            torch._dynamo.reset()  # the next mode compiles afresh
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


MODES = ("plain", "mismatch", "odd", "data_parallel", "debug")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each mode's result on both ranks. Every mode runs in one spawn of two processes, one after the other in one
    process group (a spawn costs seconds); a mode that fails reports its error and the next one compiles afresh."""
    found = spawn_ranks(worker, tmp_path_factory.mktemp("partition"), MODES)
    return {mode: [result[mode] for result in found] for mode in MODES}


def test_partition_halves_saved_bytes_and_matches_single_process(ranks):
    single = copy.deepcopy(make_model())
    loss, grads = run_step(torch.compile(single, backend="remat", options={"inner": "aot_eager"}))
    single_plan = remat.last_plan()
    single_bytes = {d.name: d.nbytes for d in single_plan.decisions if d.action is remat.Action.SAVE}
    eager_loss, eager_grads = run_step(make_model())
    assert (loss, grads) == (eager_loss, eager_grads)
    plain = ranks["plain"]
    assert plain[0]["fingerprint"] == plain[1]["fingerprint"]
    for result in plain:
        assert "error" not in result, result.get("error")
        assert result["loss"] == loss and result["grads"] == grads  # bitwise: same floats
        partitioned = result["partitioned"]
        assert len(partitioned) >= 3
        for name, nbytes, kept in partitioned:
            assert nbytes == single_bytes[name] and 2 * kept == nbytes


def test_ranks_that_plan_differently_fail_clearly(ranks):
    for result in ranks["mismatch"]:
        assert "RankDisagreement" in result["error"] and "tanh" in result["error"]
        assert "rank 1 planned decision" in result["error"]


def test_partition_of_odd_sized_values_checks_under_debug_and_matches_single_process(ranks):
    """A value whose element count is not a multiple of the world size: the plan, the simulation and the runtime
    agree on its shard (ceil(numel / world) elements), so debug=True's invariant checks pass; remat::shard records
    its calls and bytes in the profile as the gather does."""
    loss, grads = run_step(make_model(ODD["width"]), ODD["batch"])
    odd = ranks["odd"]
    for result in odd:
        assert "error" not in result, result.get("error")
    assert odd[0]["fingerprint"] == odd[1]["fingerprint"]
    for result in odd:
        assert result["loss"] == loss and result["grads"] == grads
        shapes = result["partitioned_shapes"]
        assert shapes and all(math.prod(shape) % 2 == 1 for shape, _ in shapes), shapes
        # ceil(numel / 2) elements per rank, in the value's dtype (fp32 activations, a bool dropout mask)
        shards = [
            -(-math.prod(shape) // 2) * torch.empty((), dtype=getattr(torch, dtype)).element_size()
            for shape, dtype in shapes
        ]
        assert [kept for _, _, kept in result["partitioned"]] == shards
        expected = sum(shards)
        assert result["shard"] == [len(shapes), expected]
        # adjacent gathers share one profile mark; the bytes are what the all_gathers return: both ranks' shards
        assert 1 <= result["gather"][0] <= len(shapes) and result["gather"][1] == 2 * expected


def test_partition_over_ranks_with_different_data_raises_instead_of_mixing_them(ranks):
    """partition shards values identical across the group. With each rank's own batch (data parallelism over the
    world) the gathered value would mix both ranks' data; the ranks compare checksums first and every rank raises,
    naming the value and the group to use. Checked on the first call of a graph; with debug=True on every call."""
    for mode in ("data_parallel", "debug"):
        for result in ranks[mode]:
            error = result.get("error", "")
            assert error.startswith("PartitionMismatch: partition: the saved value"), (mode, error)
            assert "tensor-/model-parallel group" in error


def gathers_worker(rank, world, init, out, count):
    # a one-minute group timeout: a rank left waiting on a hung peer fails in a minute
    timeout = datetime.timedelta(minutes=1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)

    def gather():
        decisions = [SimpleNamespace(name=f"v{i}", action=remat.Action.SAVE, kept=i) for i in range(40)]
        start = time.monotonic()
        with torch._dispatch.python.enable_python_dispatcher():  # on, as while a compile runs
            for _ in range(count):
                check_ranks_agree(SimpleNamespace(decisions=decisions), dist.group.WORLD)
        return {"seconds": time.monotonic() - start}

    report(out, rank, gather)


def test_plan_checks_across_ranks_never_deadlock_under_the_python_dispatcher(tmp_path):
    """The plan check gathers at compile time, where torch's Python dispatcher is on. A gloo collective entered
    through it holds the GIL while it waits for the group's work queue, whose worker thread needs the GIL to free the
    previous collective's tensors: without remat turning the dispatcher off, two ranks hang within a few hundred
    gathers (seen in a DDP test: both ranks in the check, for good)."""
    results = spawn_ranks(gathers_worker, tmp_path, 2000, deadline_s=150)
    assert all("error" not in r for r in results), results
