# %% [markdown]
# # What gets recomputed, layer by layer, in a Hugging Face GPT-2
#
# A transformer built from a `transformers.GPT2Config` with random weights (nothing is downloaded): 2 layers, width 64,
# 4 heads, 64 positions, vocabulary 128, and GPT-2's default dropout of 0.1 on embeddings, attention and residuals.
# `remat.explain` plans the training step without running it; `Plan.module_table` groups its decisions by the module
# that produced each value. Then: what `save_ops` changes, and how dropout is handled.

# %%
import collections
import copy
import warnings

# the notebooks' shared code (helpers.py, next to this notebook), imported before torch: it quiets the profiler
from helpers import LossStep, gradients, mismatched, train_step

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by transformers, in a bare kernel

# isort: split
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


# %% [markdown]
# The loss is computed here rather than by passing `labels=` to the model: this version of transformers computes it
# through a helper that `torch.compile` cannot trace, which splits the step into two graphs, and a plan covers one
# graph. The cell checks that the step compiles to a single graph.

# %%
def next_token_loss(lm, ids):
    """Next-token cross-entropy of the language model."""
    logits = lm(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


step = LossStep(lm, next_token_loss)  # one graph for forward and loss
print("graphs:", torch._dynamo.explain(step)(ids).graph_count)
torch._dynamo.reset()

# %% [markdown]
# ## Decisions per layer
#
# Half-way between the least peak remat can reach and the baseline's peak (aot_eager's min-cut partition,
# `memory_budget=0.5`), then at the least peak (`0.0`). `depth=4` joins each block's submodules into one line per
# block.

# %%
half = remat.explain(step, ids, memory_budget=0.5)
print(half.summary())
print()
print(half.module_table())

# %%
least = remat.explain(step, ids, memory_budget=0.0)
print(least.summary())
print()
print(least.module_table(depth=4))

# %% [markdown]
# ## `save_ops`: always keep the output of some ops
#
# `save_ops=["aten.mm"]` is the usual selective-checkpointing choice: keep matmul outputs, recompute the cheap pointwise
# ops around them. Whether it changes anything depends on which ops the model's matmuls lower to and on which of their
# outputs backward reads; the next cells count the matmul-like ops among the values backward needs, then plan at the
# least peak with and without `save_ops`.

# %%
ops = collections.Counter(d.source_op or d.op for d in least.decisions)
print("matmul-like ops whose outputs backward reads, with their counts:")
for op, n in sorted(ops.items()):
    if "mm" in op or "linear" in op:
        print(f"    {op}: {n}")


# %%
def compare(save_ops):
    plan = remat.explain(step, ids, memory_budget=0.0, save_ops=save_ops)
    before = {d.name: d.action for d in least.decisions}
    changed = [(d.name, d.op, d.action.value) for d in plan.decisions if before.get(d.name) != d.action]
    print(f"save_ops={save_ops}: {len(changed)} decisions differ from the plan without save_ops")
    for name, op, action in changed:
        print(f"    {name} ({op}): now {action}")
    print("   ", plan.summary())
    return plan


print("without save_ops:\n   ", least.summary())
with_mm = compare(["aten.mm"])
with_addmm = compare(["aten.addmm"])

# %% [markdown]
# GPT-2's projections are `transformers` `Conv1D` layers, which call `torch.addmm` (bias + input @ weight), and the
# backward of a matmul reads its inputs, not its output, so an output head's `mm` need not be among the values backward
# reads. `save_ops` acts only on ops in the count above: name the op the model actually runs. The per-layer view of the
# plan with `save_ops=["aten.addmm"]`:

# %%
print(with_addmm.module_table(depth=4))

# %% [markdown]
# ## Dropout: replayed, not re-drawn
#
# Recomputing a dropout in backward with the global generator would draw a new mask, and the gradients would be those of
# a different forward. remat's default `rng="replay"` records the generator state before each random op it recomputes
# (5056 bytes on CPU, 16 on CUDA) and re-runs the op from that state in backward, so it draws the same mask; a random op
# whose output is smaller than that state is simply saved. `rng="save"` keeps every random op's outputs instead. Under
# inductor only inductor's own random ops (which draw from a seeds tensor) are replayed; eager's random ops, which
# inductor runs with `fallback_random`, are saved. The rows below plan for `aot_eager` (the step compiled next): the
# dropout masks (bool tensors) at budget 0.0 under both settings, and the generator states replay keeps:

# %%
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


# %% [markdown]
# Now compile the step at budget 0.0 and run one training step from a fixed seed, next to the uncompiled model from
# the same seed: the loss, every gradient and the state of the random generator afterwards must be identical.

# %%
eager = copy.deepcopy(step)
eager_loss = train_step(eager, ids, seed=1234)
eager_after = torch.rand(4)  # the generator's state after the step: equal only if nothing drew extra numbers
eager_grads = gradients(eager)

compiled = torch.compile(copy.deepcopy(step), backend="remat", options={"memory_budget": 0.0, "inner": "aot_eager"})
loss = train_step(compiled, ids, seed=1234)
after = torch.rand(4)
plan = remat.last_plan()
differ = mismatched(gradients(compiled), eager_grads)
print(f"recomputed in backward: {plan.recompute_flops / 1e6:.1f} MFLOP; peak {plan.peak_bytes / 2**20:.2f} MiB "
      f"({plan.baseline.kind} {plan.baseline.peak_bytes / 2**20:.2f} MiB)")
print(f"loss equal: {torch.equal(loss, eager_loss)}")
print(f"gradients equal (torch.equal): {len(eager_grads) - len(differ)} of {len(eager_grads)}")
print(f"generator state after the step equal: {torch.equal(after, eager_after)}")
assert torch.equal(loss, eager_loss) and not differ and torch.equal(after, eager_after), differ
