"""The all-gathers remat's runtime issues from Python (shard gathers, partition checksums), run so that a gloo
process group cannot deadlock on them.

A gloo process group runs each collective on a thread of its own and releases the collective's work object there,
while holding the lock its next collective must take. If Python dropped the last references to the work's tensors
before that release, the release frees Python objects and waits for the interpreter lock, which the Python thread
holds while it enqueues its next collective on that same lock: both wait forever. So the tensors of each gather stay
referenced from Python until the next gather on this thread begins, long after the group's thread let go of them;
then they are released by Python, under the interpreter lock.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_held = threading.local()


def all_gather(tensor: torch.Tensor, world: int, group: Any = None) -> torch.Tensor:
    """The `world` ranks' `tensor`s concatenated along a new first dimension: shape (world, *tensor.shape)."""
    import torch.distributed as dist

    _held.last = None  # the previous gather's tensors, released by this thread before the group takes its lock
    source = tensor.contiguous().view(-1)
    out = torch.empty(world * source.numel(), dtype=source.dtype, device=source.device)
    dist.all_gather_into_tensor(out, source, group=group)
    _held.last = (source, out)
    return out.view(world, *tensor.shape)
