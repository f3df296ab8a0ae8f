"""Side streams and copy events for host offload on CUDA (nothing here runs on CPU).

Copies to and from the host run on one side stream per device, so they overlap the compute stream. A device
tensor handed to a copy is marked with `record_stream`, which keeps the caching allocator from reusing its memory
before the copy has read it; the host copy carries the event its reload waits for.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

_side: dict[torch.device, "torch.cuda.Stream"] = {}
_copy_done: WeakIdKeyDictionary = WeakIdKeyDictionary()  # host tensor → event recorded after its D2H copy


def side_stream(device: torch.device) -> "torch.cuda.Stream":
    if device not in _side:
        _side[device] = torch.cuda.Stream(device)
    return _side[device]


def to_host(x: torch.Tensor) -> torch.Tensor:
    """Copy a CUDA tensor to pinned host memory on the side stream; returns at once."""
    host = torch.empty_like(x, device="cpu", pin_memory=True)
    stream = side_stream(x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(stream):
        host.copy_(x, non_blocking=True)
        _copy_done[host] = torch.cuda.Event()
        _copy_done[host].record(stream)
    x.record_stream(stream)
    return host


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a host tensor back on the side stream; the compute stream waits for the copy before using it."""
    stream = side_stream(device)
    event = _copy_done.pop(host, None)
    with torch.cuda.stream(stream):
        if event is not None:
            stream.wait_event(event)
        out = torch.empty_like(host, device=device)
        out.copy_(host, non_blocking=True)
    torch.cuda.current_stream(device).wait_stream(stream)
    out.record_stream(torch.cuda.current_stream(device))
    return out
