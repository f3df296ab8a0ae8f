"""remat's runtime: the ops the rewritten graphs and the eager checkpointing APIs call.

`table` declares each checkpoint op once (fake implementation, profile key, how the rewrite inserts it, what it keeps
on the device); `ops` holds their kernels and registers them with torch.library (so aot_eager and inductor both
compile them), `streams` holds the CUDA side streams and copy events, `buffers` the arena pool of contiguous
checkpointing, `profile` the per-step records.
"""

from . import ops  # noqa: F401  (registers the remat:: ops)
