# %% [markdown]
# # Budget sweep: remat against torch's `activation_memory_budget`, measured
#
# `remat.pareto` plans one training graph under several budgets and, with `measure=True`, compiles and runs every row:
# the measured peak (`remat.peak_memory` of one forward+backward) and the median step time, divided by the step time of
# plain `torch.compile(backend="aot_eager")` measured in the same call. `remat.torch_budget_points` measures torch's own
# knob, `torch._functorch.config.activation_memory_budget`, the same way, so both land on the same axes.
#
# A fraction means different things to the two: remat's `0.5` is half-way between the least peak remat can reach and
# the baseline's peak (aot_eager's min-cut partition, as plain `torch.compile(backend="aot_eager")` runs it); torch's
# `0.5` asks its min-cut partitioner to save for backward at most half the activation bytes its default partition
# saves.

# %%
# the notebooks' shared code (helpers.py, next to this notebook), imported before torch: it quiets the profiler
from helpers import MIB

# isort: split
import torch

import remat
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

# %matplotlib inline
# One intra-op thread: with several, a step waits for its slowest thread, and on a shared machine that makes step
# times depend on whatever else is running more than on the plan.
torch.set_num_threads(1)

config = GPTConfig(vocab=512, n_layer=2, d_model=128, n_head=4, seq_len=128, dropout=0.1)
model = GPT(config)
batch = make_gpt_batch(config, batch=4)

# %% [markdown]
# ## remat, one row per budget
#
# `pareto` deep-copies the model for every row, so the notebook's model is left untouched.

# %%
sweep = remat.pareto(model, *batch, loss_fn=gpt_loss, budgets=(1.0, 0.75, 0.5, 0.25, 0.0), measure=True, repeat=5)
print(sweep.table())

# %% [markdown]
# ## torch's `activation_memory_budget`, measured the same way
#
# Timed against the reference step the sweep above measured, so the ratios share one denominator.

# %%
torch_points = remat.torch_budget_points(model, *batch, loss_fn=gpt_loss, budgets=(1.0, 0.5, 0.2, 0.0),
                                         reference_step_ms=sweep.reference_step_ms, repeat=5)
print(f"{'torch budget':<14}{'measured MiB':>13}{'step ratio':>12}")
for label, peak, ratio in torch_points:
    print(f"{label.removeprefix('torch '):<14}{peak / MIB:>13.2f}{ratio:>12.2f}")

# %% [markdown]
# ## Both on one plot
#
# x: measured peak activation memory; y: step time relative to plain `torch.compile`. Lower-left is better. Each remat
# point is labelled with its budget, each torch point (black squares) with its fraction.

# %%
fig = remat.plot_pareto(sweep, torch_points=torch_points)
fig

# %% [markdown]
# ## What the numbers say
#
# The next cell reads this run's measurements and states what they show; nothing below is typed in by hand. Peaks are
# measured from allocation events and repeat exactly from run to run on CPU. Step-time ratios are wall-clock medians of
# five steps of a small model: they move by several percent between runs, so read small differences as noise.

# %%
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
