"""partition="world" with two gloo processes on CPU: each rank keeps half of every partitioned value, gradients
equal the single-process run, and ranks that plan differently fail with an error naming the decision."""
import copy
import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import remat

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))


def run_step(module):
    torch.manual_seed(5)
    x = torch.randn(32, 128)
    loss = module(x).sum()
    loss.backward()
    return loss.item(), [p.grad.flatten().tolist() for p in module.parameters()]


def worker(rank, world, port, out, mode):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        options = {"inner": "aot_eager", "partition": "world"}
        if mode == "mismatch":  # a policy that depends on the rank: the ranks' plans differ
            options["policy"] = lambda node: remat.Action.RECOMPUTE if rank == 1 and "tanh" in node.op else None
        compiled = torch.compile(make_model(), backend="remat", options=options)
        try:
            loss, grads = run_step(compiled)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
            result = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            plan = remat.last_plan()
            result = {"loss": loss, "grads": grads, "fingerprint": plan.fingerprint(),
                      "partitioned": [(d.name, d.nbytes, d.kept) for d in plan.decisions
                                      if d.action is remat.Action.PARTITION]}
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def spawn(tmp_path, mode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, str(tmp_path), mode), nprocs=2)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_partition_halves_saved_bytes_and_matches_single_process(tmp_path):
    single = copy.deepcopy(make_model())
    loss, grads = run_step(torch.compile(single, backend="remat", options={"inner": "aot_eager"}))
    single_plan = remat.last_plan()
    single_bytes = {d.name: d.nbytes for d in single_plan.decisions if d.action is remat.Action.SAVE}
    eager_loss, eager_grads = run_step(make_model())
    assert (loss, grads) == (eager_loss, eager_grads)
    ranks = spawn(tmp_path, "plain")
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"]
    for result in ranks:
        assert "error" not in result, result.get("error")
        assert result["loss"] == loss and result["grads"] == grads  # bitwise: same floats
        partitioned = result["partitioned"]
        assert len(partitioned) >= 3
        for name, nbytes, kept in partitioned:
            assert nbytes == single_bytes[name] and 2 * kept == nbytes


def test_ranks_that_plan_differently_fail_clearly(tmp_path):
    ranks = spawn(tmp_path, "mismatch")
    for result in ranks:
        assert "RankDisagreement" in result["error"] and "tanh" in result["error"]
        assert "rank 1 planned decision" in result["error"]
