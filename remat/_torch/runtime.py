"""torch internals remat's runtime reads: storage sharing, tensor versions, the RNG replay ops, fake-tensor mode
and the profiler's allocation records."""

from __future__ import annotations

from typing import Any

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


def outside_fake_mode() -> Any:
    """A context in which tensors are real again while a compile runs under fake tensors (for collectives at
    compile time)."""
    return lookup("torch._subclasses.fake_tensor", "unset_fake_temporarily")()


def is_allocation(event: Any) -> bool:
    """Whether a node of the profiler's event tree (`kineto_results.experimental_event_tree()`) records an
    allocation or free (its `extra_fields` then hold device, ptr and signed alloc_size)."""
    import torch

    kinds = getattr(getattr(torch._C, "_profiler", None), "_EventType", None)
    if kinds is None:
        raise missing("torch._C._profiler._EventType")
    return bool(event.tag == kinds.Allocation)
