# %% [markdown]
# # Offload, partition, contiguous arenas and profiling
#
# Besides save and recompute, remat can keep a saved activation **in host memory** (`offload`), **split across the
# ranks of a process group** (`partition`), or **in one preallocated arena per graph** (`contiguous`). Each is a
# decision per value in the Plan, a pair of ops in the rewritten graph (`remat::offload` / `remat::reload`,
# `remat::shard` / all-gather, `remat::arena_store`), and part of the memory simulation the planner checks budgets with.
#
# This notebook runs on CPU. There the host *is* the device, so offloading frees nothing — the simulation counts the
# host copy, and `offload="auto"` never picks it. On a CUDA device the copies run on a side stream into pinned memory
# and the offloaded bytes leave the device peak. Everything else below is the same code path as on a GPU.

# %%
import copy

# the notebooks' shared code (helpers.py, next to this notebook), imported before torch: it quiets the profiler
from helpers import MIB, gradients, mean_square, mismatched, train_step

# isort: split
import torch

import remat
from remat.runtime import buffers
from remat.zoo import MLP, make_mlp_batch

torch.manual_seed(0)
model = MLP(width=512, depth=4)
x = make_mlp_batch(512, batch=64)

eager = copy.deepcopy(model)
eager_loss = train_step(eager, x, loss_fn=mean_square)  # the loss: the mean of the squared output
eager_grads = gradients(eager)

# %% [markdown]
# ## Offload
#
# `offload=True` keeps every saved activation of at least 1 KiB on the host between forward and backward (a policy can
# answer `Action.OFFLOAD` for single values instead). The plan says so per value; the forward module holds one
# `remat::offload` per offloaded value and the backward one `remat::reload`, placed just before the value's first use:

# %%
compiled = torch.compile(copy.deepcopy(model), backend="remat",
                         options={"offload": True, "inner": "aot_eager", "profile": True})
loss = train_step(compiled, x, loss_fn=mean_square)
plan = remat.last_plan()
print(plan.table(max_rows=6))
forward, backward = remat.last_graphs()
print("offload ops in forward:", forward.code.count("remat.offload.default("),
      "| reload ops in backward:", backward.code.count("remat.reload.default("))
print("loss and gradients equal to eager:",
      torch.equal(loss, eager_loss) and not mismatched(gradients(compiled), eager_grads))

# %% [markdown]
# With `profile=True` every step records the bytes and seconds of offload, reload, recomputation and gathers
# (`remat.last_plan().profile`):

# %%
for _ in range(2):
    train_step(compiled, x, loss_fn=mean_square)
for i, record in enumerate(plan.profile.steps):
    print(f"step {i}: offloaded {record.bytes['offload'] / MIB:.2f} MiB in {record.seconds['offload'] * 1e3:.2f} ms, "
          f"reloaded {record.bytes['reload'] / MIB:.2f} MiB in {record.seconds['reload'] * 1e3:.2f} ms")

# %% [markdown]
# ## Contiguous arenas
#
# `contiguous=True` copies the saved values of a step into one buffer per graph instead of one allocation each. The
# first step learns the size, the second allocates it, and from then on steps reuse it (a buffer still held by an
# earlier step's saved values is never handed out again until that step's backward has freed them):

# %%
buffers.POOL.clear()
compiled = torch.compile(copy.deepcopy(model), backend="remat",
                         options={"contiguous": True, "memory_budget": 0.5, "inner": "aot_eager"})
for i in range(4):
    train_step(compiled, x, loss_fn=mean_square)
    print(f"after step {i}: {buffers.POOL.stats.allocations} arena allocated, reused {buffers.POOL.stats.reuses} times")
print("gradients equal to eager:", not mismatched(gradients(compiled), eager_grads))

# %% [markdown]
# ## Partition across ranks
#
# With `partition="world"` each rank keeps 1/world of every saved value and all-gathers it (torch's functional
# collectives) just before backward reads it. Every rank must take the same decisions, so at compile time the ranks
# compare their plans and a mismatch raises an error naming the first differing decision. Two gloo processes on this
# CPU (`notebooks/partition_worker.py`: the same model, `partition="world"`, one training step):

# %%
import subprocess
import sys

single = remat.explain(model, x, inner="aot_eager")  # as the ranks compile it
print(f"single process: saves {single.saved_bytes / MIB:.2f} MiB")
ranks = subprocess.run(
    [sys.executable, "partition_worker.py", "2"], capture_output=True, text=True, check=True, timeout=240
)
print(ranks.stdout.strip())
