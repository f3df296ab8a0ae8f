"""Write the notebooks in this folder from the cell sources below, then execute them in place.

    python notebooks/build.py                  # write and execute all four (about 3 minutes on 2 CPU cores)
    python notebooks/build.py 01_quickstart    # only the named ones
    python notebooks/build.py --no-execute     # write the cells without outputs

Edit a notebook here, not in Jupyter: tests/test_notebooks.py checks that every .ipynb holds exactly these cells, with
outputs (they are committed executed so they read well on a code host), and re-executes each one.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNEL = "python3"
CELL_TIMEOUT_S = 300


def md(source: str) -> tuple[str, str]:
    return ("markdown", source.strip("\n"))


def code(source: str) -> tuple[str, str]:
    return ("code", source.strip("\n"))


# Shared by the notebooks that measure: remat.peak_memory reads torch's CPU profiler, whose C++ side logs a line at
# every start and stop; the environment variables must be set before torch is imported.
QUIET_PROFILER = '''
import os

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # keep the CPU profiler's start/stop log lines out of the outputs
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
'''

GPT_STEP = '''
class Step(torch.nn.Module):
    """The model and its loss, compiled together so the loss's activations are planned too."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return gpt_loss(self.model, idx, targets)
'''

QUICKSTART = [
    md('''
# Quickstart: a GPT-style model under a byte budget

`remat` is a `torch.compile` backend. For every activation of the forward pass it decides whether to keep it for
backward or to recompute it there, so that the training step's **peak activation memory** stays under the budget you
state in bytes. This notebook compiles a small GPT-style model with dropout, shows what was decided and why, draws the
memory timeline, measures the peak, and checks that the gradients are exactly the uncompiled model's.

Everything runs on CPU. `inner="aot_eager"` runs the planned forward and backward as plain PyTorch ops (no inductor
code generation), which keeps compilation quick and makes gradients comparable bit for bit.
'''),
    code(QUIET_PROFILER + '''
import copy

import torch

import remat
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

%matplotlib inline
MIB = 2**20
'''),
    md('''
## The model

Four pre-LayerNorm transformer blocks, width 128, sequence 128, batch 4, dropout 0.1 on attention probabilities,
attention output and MLP output. The model and its cross-entropy loss are wrapped in one module so the loss's
activations are planned as well.
'''),
    code('''
config = GPTConfig(vocab=512, n_layer=4, d_model=128, n_head=4, seq_len=128, dropout=0.1)
''' + GPT_STEP + '''

model = Step(GPT(config))
batch = make_gpt_batch(config, batch=4)


def train_step(module, seed=0):
    """One forward + backward from a fixed RNG seed, so dropout draws the same masks every time."""
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(*batch)
    loss.backward()
    return loss.detach()


reference = copy.deepcopy(model)  # the uncompiled model: the gradients every plan must reproduce
reference_loss = train_step(reference)
reference_grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; loss {reference_loss.item():.4f}")
'''),
    md('''
## Compile under a budget

The budget is stated in bytes (`"16MiB"`, or an int). It bounds the peak of the bytes the step itself creates —
activations, saved values, recomputed values, backward temporaries — not parameters, their gradients or inputs.
`remat.explain` plans without running anything, which tells us the range a budget can take for this model: the peak of
torch's default partition (which keeps everything backward reads) and the least peak remat can reach.
'''),
    code('''
BUDGET = "16MiB"

least = remat.explain(model, *batch, memory_budget=0.0, inner="aot_eager")  # as compiled below
print(f"default partition peak: {least.baseline.peak_bytes / MIB:.2f} MiB")
print(f"least peak remat can reach: {least.peak_bytes / MIB:.2f} MiB")

compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"memory_budget": BUDGET, "inner": "aot_eager"})
loss = train_step(compiled)  # the first call traces, plans and compiles
plan = remat.last_plan()
print()
print(plan.summary())
'''),
    md('''
## Every decision, with its reason

One row per value that backward needs: its bytes, what recomputing it would cost, the action and why. Totals at the
bottom count every row, not only the ones printed.
'''),
    code('''
print(plan.table(max_rows=15))
'''),
    md('''
The same decisions grouped by the module that produced them (from the FX node's stack trace):
'''),
    code('''
print(plan.module_table())
'''),
    md('''
## Memory over the step

Live activation memory at every step of the schedule: forward, then backward with the recomputation placed just
before its first use (shaded). The grey curve is the default partition's; the dashed line is the budget.
'''),
    code('''
fig = plan.plot_timeline()
fig
'''),
    md('''
## Measured peak and gradients

`remat.peak_memory` measures one call: on CPU from the profiler's allocation events, leaving out the parameters'
gradients as the planner does. Then every gradient is compared with the uncompiled model's, bit for bit.
'''),
    code('''
measured = remat.peak_memory(lambda: train_step(compiled), exclude=lambda: [p.grad for p in compiled.parameters()])
print(f"budget          {plan.budget_bytes / MIB:8.2f} MiB")
print(f"simulated peak  {plan.peak_bytes / MIB:8.2f} MiB")
print(f"measured peak   {measured / MIB:8.2f} MiB  ({measured / plan.peak_bytes:.3f} x simulated)")
'''),
    code('''
grads = {name.removeprefix("_orig_mod."): p.grad for name, p in compiled.named_parameters()}
mismatched = [name for name, g in reference_grads.items() if not torch.equal(grads[name], g)]
print(f"loss equal: {torch.equal(loss, reference_loss)}")
print(f"gradients equal (torch.equal): {len(reference_grads) - len(mismatched)} of {len(reference_grads)}")
assert torch.equal(loss, reference_loss) and not mismatched, mismatched
'''),
]

BUDGET_SWEEP = [
    md('''
# Budget sweep: remat against torch's `activation_memory_budget`, measured

`remat.pareto` plans one training graph under several budgets and, with `measure=True`, compiles and runs every row:
the measured peak (`remat.peak_memory` of one forward+backward) and the median step time, divided by the step time of
plain `torch.compile(backend="aot_eager")` measured in the same call. `remat.torch_budget_points` measures torch's own
knob, `torch._functorch.config.activation_memory_budget`, the same way, so both land on the same axes.

A fraction means different things to the two: remat's `0.5` is half-way between the least peak remat can reach and
the default partition's peak; torch's `0.5` asks its min-cut partitioner to save for backward at most half the
activation bytes its default partition saves.
'''),
    code(QUIET_PROFILER + '''
import torch

import remat
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

%matplotlib inline
MIB = 2**20
# One intra-op thread: with several, a step waits for its slowest thread, and on a shared machine that makes step
# times depend on whatever else is running more than on the plan.
torch.set_num_threads(1)

config = GPTConfig(vocab=512, n_layer=2, d_model=128, n_head=4, seq_len=128, dropout=0.1)
model = GPT(config)
batch = make_gpt_batch(config, batch=4)
'''),
    md('''
## remat, one row per budget

`pareto` deep-copies the model for every row, so the notebook's model is left untouched.
'''),
    code('''
sweep = remat.pareto(model, *batch, loss_fn=gpt_loss, budgets=(1.0, 0.75, 0.5, 0.25, 0.0), measure=True, repeat=5)
print(sweep.table())
'''),
    md('''
## torch's `activation_memory_budget`, measured the same way

Timed against the reference step the sweep above measured, so the ratios share one denominator.
'''),
    code('''
torch_points = remat.torch_budget_points(model, *batch, loss_fn=gpt_loss, budgets=(1.0, 0.5, 0.2, 0.0),
                                         reference_step_ms=sweep.reference_step_ms, repeat=5)
print(f"{'torch budget':<14}{'measured MiB':>13}{'step ratio':>12}")
for label, peak, ratio in torch_points:
    print(f"{label.removeprefix('torch '):<14}{peak / MIB:>13.2f}{ratio:>12.2f}")
'''),
    md('''
## Both on one plot

x: measured peak activation memory; y: step time relative to plain `torch.compile`. Lower-left is better. Each remat
point is labelled with its budget, each torch point (black squares) with its fraction.
'''),
    code('''
fig = remat.plot_pareto(sweep, torch_points=torch_points)
fig
'''),
    md('''
## What the numbers say

The next cell reads this run's measurements and states what they show; nothing below is typed in by hand. Peaks are
measured from allocation events and repeat exactly from run to run on CPU. Step-time ratios are wall-clock medians of
five steps of a small model: they move by several percent between runs, so read small differences as noise.
'''),
    code('''
remat_rows = [r for r in sweep.rows if r.budget_bytes is not None]
remat_peaks = [r.measured_peak_bytes for r in remat_rows]
torch_peaks = [peak for _, peak, _ in torch_points]
non_increasing = all(a >= b for a, b in zip(remat_peaks, remat_peaks[1:]))
within = all(r.measured_peak_bytes <= 1.05 * r.budget_bytes for r in remat_rows)
print(f"remat: as the budget falls from {remat_rows[0].budget} to {remat_rows[-1].budget}, the measured peak goes "
      f"{' -> '.join(f'{p / MIB:.2f}' for p in remat_peaks)} MiB: "
      f"{'never rises' if non_increasing else 'RISES at some step'}; every row is "
      f"{'within' if within else 'NOT within'} 5% of its budget.")
print(f"torch: as its fraction falls {' -> '.join(label.removeprefix('torch ') for label, _, _ in torch_points)}, "
      f"its measured peak goes {' -> '.join(f'{p / MIB:.2f}' for p in torch_peaks)} MiB.")
print(f"least measured peak: remat {min(remat_peaks) / MIB:.2f} MiB, torch {min(torch_peaks) / MIB:.2f} MiB "
      f"(the reference, torch's defaults: {sweep.reference_peak_bytes / MIB:.2f} MiB).")
remat_ratios = [r.step_ratio for r in remat_rows]
torch_ratios = [ratio for _, _, ratio in torch_points]
print(f"step time / plain torch.compile: remat {min(remat_ratios):.2f} to {max(remat_ratios):.2f}, "
      f"torch {min(torch_ratios):.2f} to {max(torch_ratios):.2f}.")
rises = [(a[0], b[0]) for a, b in zip(torch_points, torch_points[1:]) if b[1] > a[1]]
if rises:
    print("torch's peak rises as its budget falls at: "
          + ", ".join(f"{a.removeprefix('torch ')} -> {b.removeprefix('torch ')}" for a, b in rises)
          + " — its fraction bounds the bytes saved for backward, not the peak of the step.")
'''),
]

RECOMPUTED = [
    md('''
# What gets recomputed, layer by layer, in a Hugging Face GPT-2

A transformer built from a `transformers.GPT2Config` with random weights (nothing is downloaded): 2 layers, width 64,
4 heads, 64 positions, vocabulary 128, and GPT-2's default dropout of 0.1 on embeddings, attention and residuals.
`remat.explain` plans the training step without running it; `Plan.module_table` groups its decisions by the module
that produced each value. Then: what `save_ops` changes, and how dropout is handled.
'''),
    code(QUIET_PROFILER + '''
import collections
import copy
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by transformers, in a bare kernel

import torch
import torch.nn.functional as F
import transformers

import remat

torch.manual_seed(0)  # transformers initialises weights from the global generator
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=128,
                                 bos_token_id=0, eos_token_id=0, attn_implementation="eager")
lm = transformers.GPT2LMHeadModel(config)
ids = torch.randint(0, config.vocab_size, (4, config.n_positions), generator=torch.Generator().manual_seed(0))
print(f"{sum(p.numel() for p in lm.parameters()):,} parameters; training mode: {lm.training}")
'''),
    md('''
The loss is computed here rather than by passing `labels=` to the model: this version of transformers computes it
through a helper that `torch.compile` cannot trace, which splits the step into two graphs, and a plan covers one
graph. The cell checks that the step compiles to a single graph.
'''),
    code('''
class Step(torch.nn.Module):
    """Next-token cross-entropy of the language model: one graph for forward and loss."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        logits = self.lm(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


step = Step(lm)
print("graphs:", torch._dynamo.explain(step)(ids).graph_count)
torch._dynamo.reset()
'''),
    md('''
## Decisions per layer

Half-way between the least peak remat can reach and the default partition's peak (`memory_budget=0.5`), then at the
least peak (`0.0`). `depth=4` joins each block's submodules into one line per block.
'''),
    code('''
half = remat.explain(step, ids, memory_budget=0.5)
print(half.summary())
print()
print(half.module_table())
'''),
    code('''
least = remat.explain(step, ids, memory_budget=0.0)
print(least.summary())
print()
print(least.module_table(depth=4))
'''),
    md('''
## `save_ops`: always keep the output of some ops

`save_ops=["aten.mm"]` is the usual selective-checkpointing choice: keep matmul outputs, recompute the cheap pointwise
ops around them. Whether it changes anything depends on which ops the model's matmuls lower to and on which of their
outputs backward reads; the next cells count the matmul-like ops among the values backward needs, then plan at the
least peak with and without `save_ops`.
'''),
    code('''
ops = collections.Counter(d.source_op or d.op for d in least.decisions)
print("matmul-like ops whose outputs backward reads, with their counts:")
for op, n in sorted(ops.items()):
    if "mm" in op or "linear" in op:
        print(f"    {op}: {n}")
'''),
    code('''
def compare(save_ops):
    plan = remat.explain(step, ids, memory_budget=0.0, save_ops=save_ops)
    before = {d.name: d.action for d in least.decisions}
    changed = [(d.name, d.op, d.action.value) for d in plan.decisions if before.get(d.name) != d.action]
    print(f"save_ops={save_ops}: {len(changed)} decisions differ from the plan without save_ops")
    for name, op, action in changed:
        print(f"    {name} ({op}): now {action}")
    print("   ", plan.summary())
    return plan


print("without save_ops:\\n   ", least.summary())
with_mm = compare(["aten.mm"])
with_addmm = compare(["aten.addmm"])
'''),
    md('''
GPT-2's projections are `transformers` `Conv1D` layers, which call `torch.addmm` (bias + input @ weight), and the
backward of a matmul reads its inputs, not its output, so an output head's `mm` need not be among the values backward
reads. `save_ops` acts only on ops in the count above: name the op the model actually runs. The per-layer view of the
plan with `save_ops=["aten.addmm"]`:
'''),
    code('''
print(with_addmm.module_table(depth=4))
'''),
    md('''
## Dropout: replayed, not re-drawn

Recomputing a dropout in backward with the global generator would draw a new mask, and the gradients would be those of
a different forward. remat's default `rng="replay"` records the generator state before each random op it recomputes
(5056 bytes on CPU, 16 on CUDA) and re-runs the op from that state in backward, so it draws the same mask; a random op
whose output is smaller than that state is simply saved. `rng="save"` keeps every random op's outputs instead. Under
inductor only inductor's own random ops (which draw from a seeds tensor) are replayed; eager's random ops, which
inductor runs with `fallback_random`, are saved. The rows below plan for `aot_eager` (the step compiled next): the
dropout masks (bool tensors) at budget 0.0 under both settings, and the generator states replay keeps:
'''),
    code('''
replayed = remat.explain(step, ids, memory_budget=0.0, inner="aot_eager")
kept = remat.explain(step, ids, memory_budget=0.0, rng="save", inner="aot_eager")
for name, p in (("replay", replayed), ("save", kept)):
    masks = [d for d in p.decisions if d.dtype == "bool" and d.source_op == "aten.native_dropout.default"]
    states = [d for d in p.decisions if d.op == "rng state"]
    actions = sorted({d.action.value for d in masks})
    print(f"rng={name!r:<9} {len(masks)} dropout masks -> {actions}; {len(states)} generator states kept "
          f"({sum(d.nbytes for d in states)} bytes); saved {p.saved_bytes / 2**20:.3f} MiB, "
          f"peak {p.peak_bytes / 2**20:.3f} MiB")
print("reason:", next(d.reason for d in replayed.decisions
                      if d.source_op == "aten.native_dropout.default" and d.action is remat.Action.RECOMPUTE))
'''),
    md('''
Now compile the step at budget 0.0 and run one training step from a fixed seed, next to the uncompiled model from
the same seed: the loss, every gradient and the state of the random generator afterwards must be identical.
'''),
    code('''
def train_step(module, seed=1234):
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(ids)
    loss.backward()
    after = torch.rand(4)  # the generator's state after the step: equal only if nothing drew extra numbers
    return loss.detach(), {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in module.named_parameters()}, after


eager_loss, eager_grads, eager_after = train_step(copy.deepcopy(step))
compiled = torch.compile(copy.deepcopy(step), backend="remat", options={"memory_budget": 0.0, "inner": "aot_eager"})
loss, grads, after = train_step(compiled)
plan = remat.last_plan()
same = [n for n, g in eager_grads.items() if torch.equal(grads[n], g)]
print(f"recomputed in backward: {plan.recompute_flops / 1e6:.1f} MFLOP; peak {plan.peak_bytes / 2**20:.2f} MiB "
      f"(default partition {plan.baseline.peak_bytes / 2**20:.2f} MiB)")
print(f"loss equal: {torch.equal(loss, eager_loss)}")
print(f"gradients equal (torch.equal): {len(same)} of {len(eager_grads)}")
print(f"generator state after the step equal: {torch.equal(after, eager_after)}")
assert torch.equal(loss, eager_loss) and len(same) == len(eager_grads) and torch.equal(after, eager_after)
'''),
]

OFFLOAD = [
    md('''
# Offload, partition, contiguous arenas and profiling

Besides save and recompute, remat can keep a saved activation **in host memory** (`offload`), **split across the
ranks of a process group** (`partition`), or **in one preallocated arena per graph** (`contiguous`). Each is a
decision per value in the Plan, a pair of ops in the rewritten graph (`remat::offload` / `remat::reload`,
`remat::shard` / all-gather, `remat::arena_store`), and part of the memory simulation the planner checks budgets with.

This notebook runs on CPU. There the host *is* the device, so offloading frees nothing — the simulation counts the
host copy, and `offload="auto"` never picks it. On a CUDA device the copies run on a side stream into pinned memory
and the offloaded bytes leave the device peak. Everything else below is the same code path as on a GPU.
'''),
    code('''
import copy

import torch

import remat
from remat.runtime import buffers
from remat.zoo import MLP, make_mlp_batch

torch.manual_seed(0)
model = MLP(width=512, depth=4)
x = make_mlp_batch(512, batch=64)


def train_step(module, seed=0):
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.parameters()]


eager_loss, eager_grads = train_step(copy.deepcopy(model))
'''),
    md('''
## Offload

`offload=True` keeps every saved activation of at least 1 KiB on the host between forward and backward (a policy can
answer `Action.OFFLOAD` for single values instead). The plan says so per value; the forward module holds one
`remat::offload` per offloaded value and the backward one `remat::reload`, placed just before the value's first use:
'''),
    code('''
compiled = torch.compile(copy.deepcopy(model), backend="remat",
                         options={"offload": True, "inner": "aot_eager", "profile": True})
loss, grads = train_step(compiled)
plan = remat.last_plan()
print(plan.table(max_rows=6))
forward, backward = remat.last_graphs()
print("offload ops in forward:", forward.code.count("remat.offload.default("),
      "| reload ops in backward:", backward.code.count("remat.reload.default("))
print("loss and gradients equal to eager:",
      torch.equal(loss, eager_loss) and all(torch.equal(a, b) for a, b in zip(grads, eager_grads)))
'''),
    md('''
With `profile=True` every step records the bytes and seconds of offload, reload, recomputation and gathers
(`remat.last_plan().profile`):
'''),
    code('''
for _ in range(2):
    train_step(compiled)
for i, record in enumerate(plan.profile.steps):
    print(f"step {i}: offloaded {record.bytes['offload'] / 2**20:.2f} MiB in {record.seconds['offload'] * 1e3:.2f} ms, "
          f"reloaded {record.bytes['reload'] / 2**20:.2f} MiB in {record.seconds['reload'] * 1e3:.2f} ms")
'''),
    md('''
## Contiguous arenas

`contiguous=True` copies the saved values of a step into one buffer per graph instead of one allocation each. The
first step learns the size, the second allocates it, and from then on steps reuse it (a buffer still held by an
earlier step's saved values is never handed out again until that step's backward has freed them):
'''),
    code('''
buffers.POOL.clear()
compiled = torch.compile(copy.deepcopy(model), backend="remat",
                         options={"contiguous": True, "memory_budget": 0.5, "inner": "aot_eager"})
for i in range(4):
    loss, grads = train_step(compiled)
    print(f"after step {i}: {buffers.POOL.stats.allocations} arena allocated, reused {buffers.POOL.stats.reuses} times")
print("gradients equal to eager:", all(torch.equal(a, b) for a, b in zip(grads, eager_grads)))
'''),
    md('''
## Partition across ranks

With `partition="world"` each rank keeps 1/world of every saved value and all-gathers it (torch's functional
collectives) just before backward reads it. Every rank must take the same decisions, so at compile time the ranks
compare their plans and a mismatch raises an error naming the first differing decision. Two gloo processes on this
CPU (`notebooks/partition_worker.py`: the same model, `partition="world"`, one training step):
'''),
    code('''
import subprocess
import sys

single = remat.explain(model, x, inner="aot_eager")  # as the ranks compile it
print(f"single process: saves {single.saved_bytes / 2**20:.2f} MiB")
ranks = subprocess.run([sys.executable, "notebooks/partition_worker.py", "2"], capture_output=True, text=True, check=True)
print(ranks.stdout.strip())
'''),
]

NOTEBOOKS = {
    "01_quickstart": QUICKSTART,
    "02_budget_sweep": BUDGET_SWEEP,
    "03_what_gets_recomputed": RECOMPUTED,
    "04_offload_and_partition": OFFLOAD,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name` without outputs; cell ids are stable (the name's "01_" prefix and the cell's
    index) so a rebuild changes no id."""
    cells = []
    for index, (kind, source) in enumerate(NOTEBOOKS[name]):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cells.append(make(source, id=f"{name[:3]}{index}"))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


@contextlib.contextmanager
def own_kernel() -> Iterator[None]:
    """Within the block, the "python3" kernel runs this interpreter (`sys.executable`): a kernelspec for it is
    installed into a temporary folder put first on JUPYTER_PATH. A kernelspec found elsewhere may name a bare
    `python` from PATH, which need not be the environment remat is installed in."""
    with tempfile.TemporaryDirectory(prefix="remat-kernel-") as prefix:
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", prefix, "--name", KERNEL],
                       check=True, capture_output=True)
        old = os.environ.get("JUPYTER_PATH")
        share = os.path.join(prefix, "share", "jupyter")
        os.environ["JUPYTER_PATH"] = share if not old else os.pathsep.join([share, old])
        try:
            yield
        finally:
            if old is None:
                del os.environ["JUPYTER_PATH"]
            else:
                os.environ["JUPYTER_PATH"] = old


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell of `nb` in place (cwd = the repository root); a failing cell raises
    nbclient.exceptions.CellExecutionError. Call within `own_kernel()`."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL, record_timing=False,
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return nb


def path(name: str) -> Path:
    return HERE / f"{name}.ipynb"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"notebooks to build, of {', '.join(NOTEBOOKS)} (default: all)")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    args = parser.parse_args()
    names = args.names or list(NOTEBOOKS)
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        parser.error(f"unknown notebook(s) {unknown}; choose from {list(NOTEBOOKS)}")
    with own_kernel() if not args.no_execute else contextlib.nullcontext():
        for name in names:
            nb = build(name)
            if not args.no_execute:
                start = time.perf_counter()
                execute(nb)
                print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
            nbformat.validate(nb)
            nbformat.write(nb, path(name))


if __name__ == "__main__":
    main()
