"""torch internals remat's runtime reads: storage sharing, tensor versions, the RNG replay ops, fake-tensor mode,
the profiler's allocation records and the CUDA caching allocator's own trace."""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any, Iterator

from .guard import lookup, missing


def storage_use_count(tensor: Any) -> int:
    """How many tensors (views included) share `tensor`'s storage."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        raise missing("torch._C._storage_Use_Count")
    storage = tensor.untyped_storage()
    return count(storage._cdata) - 1  # minus the reference `storage` itself holds


def tensor_version(tensor: Any) -> int:
    """The version counter of `tensor`: raised by each in-place write to it or to a view of its storage."""
    return int(tensor._version)


def rng_replay_ops() -> tuple[Any, Any]:
    """torch's higher-order ops that run a random op recording the generator state before it, and re-run it from
    a recorded state (leaving the generator as it was): (run_and_save_rng_state, run_with_rng_state)."""
    return (
        lookup("torch._prims.rng_prims", "run_and_save_rng_state"),
        lookup("torch._prims.rng_prims", "run_with_rng_state"),
    )


@contextlib.contextmanager
def eager_dispatch() -> Iterator[None]:
    """A context for collectives at compile time: tensors are real again while the compile runs under fake tensors,
    and torch's Python dispatcher, which the compile turns on, is off.

    A collective dispatched through the Python dispatcher calls the process group holding the GIL. Gloo's worker
    thread frees the previous collective's work holding the queue lock the new call needs, and freeing a tensor made
    in Python needs the GIL: each waits for the other, for ever. Two ranks gathering objects in a loop under the
    Python dispatcher hang within a few hundred gathers."""
    unset_fake = lookup("torch._subclasses.fake_tensor", "unset_fake_temporarily")
    no_python_dispatcher = lookup("torch._C", "_DisablePythonDispatcher")
    with unset_fake(), no_python_dispatcher():
        yield


def is_allocation(event: Any) -> bool:
    """Whether a node of the profiler's event tree (`kineto_results.experimental_event_tree()`) records an
    allocation or free (its `extra_fields` then hold device, ptr and signed alloc_size)."""
    import torch

    kinds = getattr(getattr(torch._C, "_profiler", None), "_EventType", None)
    if kinds is None:
        raise missing("torch._C._profiler._EventType")
    return bool(event.tag == kinds.Allocation)


def cuda_history_recording() -> bool:
    """Whether the CUDA caching allocator is recording its memory history (`torch.cuda.memory._record_memory_history`
    turned on, by remat or by the user)."""
    import torch

    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is None:
        raise missing("torch._C._cuda_isHistoryEnabled")
    return bool(enabled())


@contextlib.contextmanager
def cuda_allocator_trace(device: Any) -> Iterator[list[tuple[str, int, int]]]:
    """The CUDA caching allocator's record of the allocations and frees on `device` while the block runs, from every
    thread (autograd runs a CUDA backward on a thread of its own): a list, filled when the block ends, of
    `(action, address, bytes)` in the order the allocator made them, `action` "alloc" or "free_requested" (a tensor
    gives its block back: `torch.cuda.memory_allocated` falls then). Recording is turned on for the block, with no
    stack traces, and off after it; the caller checks `cuda_history_recording()` first, since a history the user
    records already must not be turned off or cleared."""
    import torch

    memory = torch.cuda.memory
    record = getattr(memory, "_record_memory_history", None)
    snapshot = getattr(memory, "_snapshot", None)
    if record is None or snapshot is None:
        raise missing("torch.cuda.memory._record_memory_history and _snapshot")
    options: dict[str, Any] = {"context": None, "stacks": "python", "max_entries": sys.maxsize}
    if "clear_history" in inspect.signature(record).parameters:
        options["clear_history"] = True
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    trace: list[tuple[str, int, int]] = []
    record(enabled="all", **options)
    try:
        yield trace
        torch.cuda.synchronize(device)
        entries = snapshot(device)["device_traces"][index]
    finally:
        record(enabled=None)
    trace.extend(
        (e["action"], int(e["addr"]), int(e["size"])) for e in entries if e["action"] in ("alloc", "free_requested")
    )
