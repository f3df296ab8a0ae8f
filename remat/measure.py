"""Measured peak memory of one call, on CUDA (allocator statistics) or CPU (profiler memory events).

The planner's numbers are simulated; this module measures, so tests and benchmarks can check the simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from . import _torch
from .runtime.buffers import POOL

__all__ = ["peak_memory"]


def peak_memory(
    fn: Callable[..., Any],
    *args: Any,
    device: str | torch.device | None = None,
    exclude: Callable[[], Iterable[torch.Tensor | None]] | None = None,
    **kwargs: Any,
) -> int:
    """Peak bytes allocated during one call ``fn(*args, **kwargs)``, above the level at the start of the call.

    Memory that was allocated before the call and is still held does not count, and freeing it during the call
    does not lower the peak below zero nor offset later allocations: the result is the most bytes the call itself
    had allocated at any moment (its outputs included, while they are alive).

    One exception: remat's contiguous arenas (``contiguous=True``, ``contiguous_checkpointing``). The arena pool
    keeps its buffers from step to step, so after the first step a step's saved values allocate nothing; a buffer
    of the pool that the call stores saved values in counts for the whole call, as if allocated at its start, since
    it is part of the call's footprint. A buffer the pool allocates during the call is an allocation of the call.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:1"``, ...). None: ``"cuda"`` if any tensor in ``args``/``kwargs``
            (nested lists, tuples, dicts) or any parameter or buffer of ``fn`` (an ``nn.Module`` or a bound method
            of one) is on CUDA, else ``"cpu"``.
        exclude: called once after ``fn`` returns; yields tensors (None entries are skipped) whose memory is left
            out, e.g. ``lambda: [p.grad for p in model.parameters()]`` to measure a training step without its
            parameter gradients; a DTensor (tensor parallelism, FSDP2) stands for its local tensor on this rank.
            On CPU, for each such tensor the last allocation the call made at its data pointer is ignored, both
            when it is allocated and when it is freed; the same on CUDA.

    On CPU: the allocation and free events of ``torch.profiler`` (``profile_memory=True``), replayed in time order; a
    free counts only if its address was allocated within the call. The profiler records the calling thread (CPU
    backward runs there too); memory another Python thread allocates meanwhile is not counted. On CUDA without
    ``exclude``: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the memory allocated at
    the start. On CUDA with ``exclude``: the caching allocator's own trace of the call (its memory history, every
    thread's allocations and frees: autograd runs a CUDA backward on a thread of its own, whose frees the profiler
    does not all see), replayed the same way; so with nothing to exclude it is the figure without ``exclude``, less
    any bytes of a cached block the allocator handed out whole for a smaller request. When the allocator is recording
    a history already (the user turned it on), that history is left alone and the profiler's events are replayed
    instead; so too under ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``, which keeps no history. On CUDA every
    figure counts caching-allocator blocks (sizes rounded up to 512 bytes), and a free counts when the tensor returns
    its block to the allocator.
    """
    device = torch.device(device) if device is not None else _infer_device(fn, args, kwargs)
    if device.type == "cuda" and exclude is None:
        return _cuda_peak(fn, args, kwargs, device)
    if device.type in ("cpu", "cuda"):
        return _event_peak(fn, args, kwargs, exclude, device)
    raise ValueError(f"device={str(device)!r}: peak_memory measures 'cpu' or 'cuda' devices")


def _infer_device(fn: Callable[..., Any], args: tuple, kwargs: dict) -> torch.device:
    module = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    held = []
    if isinstance(module, torch.nn.Module):
        held = [*module.parameters(), *module.buffers()]
    if any(t.is_cuda for t in [*held, *_tensors((args, kwargs))]):
        return torch.device("cuda")
    return torch.device("cpu")


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _cuda_peak(fn, args, kwargs, device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    with POOL.watch() as arenas:
        fn(*args, **kwargs)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - start
    return max(int(peak), 0) + arenas.bytes_on(device)


def _reads_allocator_trace(device: torch.device) -> bool:
    """Whether the call's CUDA allocations are read from the caching allocator's own trace: torch's native allocator
    (cudaMallocAsync keeps no history), whose history the user is not recording already."""
    if device.type != "cuda" or torch.cuda.get_allocator_backend() != "native":
        return False
    return not _torch.cuda_history_recording()


def _event_peak(fn, args, kwargs, exclude, device: torch.device) -> int:
    events_of = _allocator_events if _reads_allocator_trace(device) else _profiler_events
    with POOL.watch() as arenas:
        events = events_of(fn, args, kwargs, device)
    excluded = _excluded_allocations(events, exclude() if exclude is not None else ())
    return _replay(events, excluded) + arenas.bytes_on(device)


def _allocator_events(fn, args, kwargs, device: torch.device) -> list[tuple[int, int, int]]:
    """``(order, address, signed bytes)`` of every allocation (+) and free (-) the CUDA caching allocator made on
    ``device`` during the call, from any thread, in its own order."""
    torch.cuda.synchronize(device)
    with _torch.cuda_allocator_trace(device) as trace:
        fn(*args, **kwargs)
    # The trace holds the bytes each tensor asked for; the allocator hands out blocks of a multiple of 512 bytes.
    events = []
    for order, (action, address, nbytes) in enumerate(trace):
        block = max(-(-nbytes // 512), 1) * 512
        events.append((order, address, block if action == "alloc" else -block))
    return events


def _profiler_events(fn, args, kwargs, device: torch.device) -> list[tuple[int, int, int]]:
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profile(activities=activities, profile_memory=True) as prof:
        fn(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return _memory_events(prof, device)


def _memory_events(prof: profile, device: torch.device) -> list[tuple[int, int, int]]:
    """``(time_ns, address, signed bytes)`` of every allocation (+) and free (-) on ``device`` the profiler saw, in
    time order.

    The flat kineto events (name ``"[memory]"``) carry bytes but no address; the event tree's allocation records
    carry both, so they are used.
    """
    found: list[tuple[int, int, int, int]] = []  # (time_ns, record order, address, signed bytes)
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        raise RuntimeError("remat.measure: the profiler holds no results; read its events after it has stopped")
    # The tree's events hold a union of per-tag field types; the tag test below picks the allocations' fields.
    stack: list[Any] = list(reversed(results.experimental_event_tree()))
    while stack:  # pre-order walk, so events stamped with the same nanosecond keep the order they were recorded in
        event = stack.pop()
        stack.extend(reversed(event.children))
        if _torch.is_allocation(event):
            fields = event.extra_fields
            if _same_device(fields.device, device) and fields.alloc_size != 0:
                found.append((event.start_time_ns, len(found), fields.ptr, fields.alloc_size))
    return [(time_ns, address, nbytes) for time_ns, _, address, nbytes in sorted(found)]


def _same_device(seen: torch.device, device: torch.device) -> bool:
    if seen.type != device.type:
        return False
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return seen.index == index


def _excluded_allocations(events: list[tuple[int, int, int]], tensors: Iterable[torch.Tensor | None]) -> set[int]:
    """Indices into ``events`` of the last allocation at each excluded tensor's address."""
    addresses = set()
    for tensor in tensors:
        if tensor is not None:
            tensor = _local(tensor)
            addresses.update({tensor.data_ptr(), tensor.untyped_storage().data_ptr()})
    last = {}
    for index, (_, address, nbytes) in enumerate(events):
        if nbytes > 0 and address in addresses:
            last[address] = index
    return set(last.values())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor holding `tensor`'s memory on this rank: a DTensor's local shard, any other tensor itself (a
    DTensor has no storage of its own to point at)."""
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            with torch.no_grad():
                return tensor.to_local()
    return tensor


def _replay(events: list[tuple[int, int, int]], excluded: set[int]) -> int:
    # address -> bytes of the counted allocations made within the window; a free of any other address (memory from
    # before the window, or an excluded allocation) is ignored. Two live blocks never share an address, so an
    # allocation at an address still counted as live means its free went unseen (freed on a thread the profiler did
    # not record): any event at a live address, its free or a new block there, ends the block counted there.
    live: dict[int, int] = {}
    total = peak = 0
    for index, (_, address, nbytes) in enumerate(events):
        if address in live:
            total -= live.pop(address)
        if nbytes > 0 and index not in excluded:
            live[address] = nbytes
            total += nbytes
            peak = max(peak, total)
    return peak


def training_peak(step: Callable[..., Any], leaves: Iterable[torch.Tensor], *args: Any) -> int:
    """Measured peak of one training step `step(*args)` with the gradients of `leaves` (parameters, inputs that
    require grad) set to None first and left out of the figure: activation memory as remat's budget counts it."""
    leaves = list(leaves)
    for t in leaves:
        t.grad = None
    return peak_memory(step, *args, exclude=lambda: [t.grad for t in leaves])


def warm_training_peak(step: Callable[..., Any], leaves: Iterable[torch.Tensor], *args: Any) -> int:
    """`training_peak` of `step(*args)` after one run left out of the figure: the run that compiles, or that sets up
    guards and caches at new input sizes."""
    leaves = list(leaves)
    for t in leaves:
        t.grad = None
    step(*args)
    return training_peak(step, leaves, *args)
