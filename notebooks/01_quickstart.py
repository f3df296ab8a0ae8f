# %% [markdown]
# # Quickstart: a GPT-style model under a byte budget
#
# `remat` is a `torch.compile` backend. For every activation of the forward pass it decides whether to keep it for
# backward or to recompute it there, so that the training step's **peak activation memory** stays under the budget you
# state in bytes. This notebook compiles a small GPT-style model with dropout, shows what was decided and why, draws the
# memory timeline, measures the peak, and checks that the gradients are exactly the uncompiled model's.
#
# Everything runs on CPU. `inner="aot_eager"` runs the planned forward and backward as plain PyTorch ops (no inductor
# code generation), which keeps compilation quick and makes gradients comparable bit for bit.

# %%
import copy

# the notebooks' shared code (helpers.py, next to this notebook), imported before torch: it quiets the profiler
from helpers import MIB, LossStep, gradients, mismatched, train_step

# isort: split
import torch

import remat
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

# %matplotlib inline

# %% [markdown]
# ## The model
#
# Four pre-LayerNorm transformer blocks, width 128, sequence 128, batch 4, dropout 0.1 on attention probabilities,
# attention output and MLP output. The model and its cross-entropy loss are wrapped in one module so the loss's
# activations are planned as well.

# %%
config = GPTConfig(vocab=512, n_layer=4, d_model=128, n_head=4, seq_len=128, dropout=0.1)
model = LossStep(GPT(config), gpt_loss)  # the model and its loss, compiled together
batch = make_gpt_batch(config, batch=4)

reference = copy.deepcopy(model)  # the uncompiled model: the gradients every plan must reproduce
reference_loss = train_step(reference, *batch)  # from a fixed seed, so dropout draws the same masks every time
reference_grads = gradients(reference)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; loss {reference_loss.item():.4f}")

# %% [markdown]
# ## Compile under a budget
#
# The budget is stated in bytes (`"16MiB"`, or an int). It bounds the peak of the bytes the step itself creates —
# activations, saved values, recomputed values, backward temporaries — not parameters, their gradients or inputs.
# `remat.explain` plans without running anything, which tells us the range a budget can take for this model: the peak of
# the inner compiler's own partition (under aot_eager, torch's min-cut partitioner, as plain
# `torch.compile(backend="aot_eager")` runs it) and the least peak remat can reach.

# %%
BUDGET = "16MiB"

least = remat.explain(model, *batch, memory_budget=0.0, inner="aot_eager")  # as compiled below
print(f"{least.baseline.kind} peak: {least.baseline.peak_bytes / MIB:.2f} MiB")
print(f"least peak remat can reach: {least.peak_bytes / MIB:.2f} MiB")

compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"memory_budget": BUDGET, "inner": "aot_eager"})
loss = train_step(compiled, *batch)  # the first call traces, plans and compiles
plan = remat.last_plan()
print()
print(plan.summary())

# %% [markdown]
# ## Every decision, with its reason
#
# One row per value that backward needs: its bytes, what recomputing it would cost, the action and why. Totals at the
# bottom count every row, not only the ones printed.

# %%
print(plan.table(max_rows=15))

# %% [markdown]
# The same decisions grouped by the module that produced them (from the FX node's stack trace):

# %%
print(plan.module_table())

# %% [markdown]
# ## Memory over the step
#
# Live activation memory at every step of the schedule: forward, then backward with the recomputation placed just
# before its first use (shaded). The grey curve is the baseline's (aot_eager's min-cut partition); the dashed line is
# the budget.

# %%
fig = plan.plot_timeline()
fig

# %% [markdown]
# ## Measured peak and gradients
#
# `remat.peak_memory` measures one call: on CPU from the profiler's allocation events, leaving out the parameters'
# gradients as the planner does. Then every gradient is compared with the uncompiled model's, bit for bit.

# %%
measured = remat.peak_memory(lambda: train_step(compiled, *batch),
                             exclude=lambda: [p.grad for p in compiled.parameters()])
print(f"budget          {plan.budget_bytes / MIB:8.2f} MiB")
print(f"simulated peak  {plan.peak_bytes / MIB:8.2f} MiB")
print(f"measured peak   {measured / MIB:8.2f} MiB  ({measured / plan.peak_bytes:.3f} x simulated)")

# %%
differ = mismatched(gradients(compiled), reference_grads)
print(f"loss equal: {torch.equal(loss, reference_loss)}")
print(f"gradients equal (torch.equal): {len(reference_grads) - len(differ)} of {len(reference_grads)}")
assert torch.equal(loss, reference_loss) and not differ, differ
