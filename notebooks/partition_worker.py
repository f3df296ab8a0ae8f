"""Two gloo ranks on this machine compile the notebook's MLP with partition="world" and run one training step.

Run by 04_offload_and_partition.ipynb (python partition_worker.py); prints one line per rank.
"""

import copy
import datetime
import sys
import tempfile

from helpers import MIB, gradients, mean_square, mismatched, train_step

# isort: split
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import remat
from remat.zoo import MLP, make_mlp_batch


# A rank stuck waiting for its peer fails with a traceback after this long instead of hanging the notebook.
TIMEOUT = datetime.timedelta(minutes=3)


def rank_step(rank, world, store, queue):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=TIMEOUT)
    torch.manual_seed(0)
    model, x = MLP(width=512, depth=4), make_mlp_batch(512, batch=64)
    eager = copy.deepcopy(model)
    eager_loss = train_step(eager, x, loss_fn=mean_square)
    compiled = torch.compile(
        copy.deepcopy(model), backend="remat", options={"partition": "world", "inner": "aot_eager"}
    )
    loss = train_step(compiled, x, loss_fn=mean_square)
    plan = remat.last_plan()
    same = torch.equal(loss, eager_loss) and not mismatched(gradients(compiled), gradients(eager))
    queue.put(
        (
            rank,
            f"rank {rank}: saves {plan.saved_bytes / MIB:.2f} MiB ({len(plan.partitioned)} values "
            f"partitioned), plan {plan.fingerprint()}, gradients equal to eager: {same}",
        )
    )
    dist.destroy_process_group()


def main(world: int = 2) -> None:
    queue = mp.get_context("spawn").SimpleQueue()
    # the ranks meet through a file store of their own (a free TCP port picked here could be taken before they bind it)
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(rank_step, args=(world, f"{folder}/store", queue), nprocs=world)
    lines = sorted(queue.get() for _ in range(world))
    print("\n".join(line for _, line in lines))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
