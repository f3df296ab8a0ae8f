"""The engine of every eager checkpointing API: run a function so that backward recomputes what it saved.

In forward the function runs under saved-tensor hooks that keep a handle instead of each tensor autograd saves; the
region keeps only its inputs (see `stash`) and the generator and autocast states it started from. The first handle
unpacked in backward re-runs the function from those inputs and states, collecting the tensors it saves in the
same order, and hands each to autograd as it asks. So the region runs at most twice per step, non-tensor inputs and
outputs and keyword arguments pass through untouched, and higher-order gradients work (the recomputation builds
a graph whenever backward does).

Inside torch.compile the region becomes torch.utils.checkpoint's non-reentrant region, which dynamo traces without
a graph break and which marks its nodes for remat's planner (see remat.regions). How the inputs are kept (offload,
partition, contiguous) is then the compiled plan's business; those options apply to eager regions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
import weakref
from typing import Any, Callable

import torch

from .._torch import BatchNormBase, tree_leaves
from ..runtime import profile as profiles
from ..runtime import rng
from .stash import Stash, StashOptions


@dataclasses.dataclass(frozen=True)
class RegionOptions:
    preserve_rng_state: bool = True  # replay the generators (dropout draws the same numbers in recomputation)
    stash: StashOptions = StashOptions()
    save_ops: frozenset = frozenset()  # ops (overloads or packets) whose outputs are saved, not recomputed


DEFAULT = RegionOptions()
NO_RNG_REPLAY = RegionOptions(preserve_rng_state=False)


def plain(preserve_rng_state: bool) -> RegionOptions:
    """Options of a plain region, picked rather than built (torch.compile traces this without constructing)."""
    return DEFAULT if preserve_rng_state else NO_RNG_REPLAY


_LIVE: "weakref.WeakSet[Region]" = weakref.WeakSet()


def live_regions() -> list["Region"]:
    """Regions whose forward ran and whose backward has not released them yet (for inspection and tests)."""
    return list(_LIVE)


def run(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    options: RegionOptions = DEFAULT,
    where: str = "remat.checkpoint",
    reserve: int | None = None,
) -> Any:
    """`fn(*args, **kwargs)` as a checkpointed region. `reserve`: arenas to allocate up front (contiguous)."""
    if torch.compiler.is_compiling():
        return _lowered(fn, args, kwargs, options)
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return fn(*args, **kwargs)  # nothing is saved for a backward that cannot happen
    region = Region(fn, options, where)
    out = region.forward(args, kwargs, reserve)
    if region.packed == 0 and not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves(out)):
        warnings.warn(
            f"{where}: nothing in the checkpointed region requires grad (no input, no parameter), so "
            "no gradient will flow through it; it ran once, without checkpointing",
            stacklevel=3,
        )
    return out


class _Handle:
    """What autograd keeps instead of a saved tensor: the region and the tensor's position in its save order."""

    __slots__ = ("region", "index")

    def __init__(self, region: "Region", index: int):
        self.region, self.index = region, index


def _unpack(handle: _Handle) -> torch.Tensor:
    return handle.region.unpack(handle.index)


class Region:
    def __init__(self, fn: Callable[..., Any], options: RegionOptions, where: str):
        self.fn, self.options, self.where = fn, options, where
        self.packed = 0
        self.shapes: list[tuple] = []  # (shape, dtype) of each saved tensor, to check the recomputation
        self.recomputed: dict[int, torch.Tensor] = {}
        self.stash: Stash | None = None
        self.rng: rng.Snapshot | None = None
        self.autocast: tuple = ()
        self.replay_ctx: Any = None
        _LIVE.add(self)

    def _pack(self, tensor: torch.Tensor) -> _Handle:
        self.shapes.append((tensor.shape, tensor.dtype))
        self.packed += 1
        return _Handle(self, self.packed - 1)

    def forward(self, args: tuple, kwargs: dict, reserve: int | None) -> Any:
        o = self.options
        devices = {t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        _sync(o.stash.sync, devices)
        self.stash = Stash(args, kwargs, o.stash, reserve)
        if o.preserve_rng_state:
            self.rng = rng.snapshot(devices)
        self.autocast = _autocast_state()
        save_ctx, self.replay_ctx = _selective(o.save_ops)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack), save_ctx:
            out = self.fn(*args, **kwargs)
        _sync(o.stash.sync, devices)
        return out

    def unpack(self, index: int) -> torch.Tensor:
        if index not in self.recomputed:
            self.recompute()
        return self.recomputed.pop(index)

    def recompute(self) -> None:
        o = self.options
        if torch.is_grad_enabled() and o.stash.offload:
            raise RuntimeError(
                f"{self.where}: higher-order gradients (create_graph=True) through a region that "
                "offloads its inputs are not supported; turn offload off for this region"
            )
        record = profiles.lookup(o.stash.profile_id)
        start = time.perf_counter()
        assert self.stash is not None  # set by the forward run that recomputation follows
        args, kwargs = self.stash.load(self.where)
        devices = {t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        _sync(o.stash.sync, devices)
        found: list[torch.Tensor] = []
        # Higher-order gradients (create_graph=True) differentiate through the recomputation, so its tensors keep
        # their history; otherwise detached values suffice, and avoid the reference cycle an output saved with its
        # own grad_fn would make.
        higher = torch.is_grad_enabled()

        def keep(tensor: torch.Tensor) -> torch.Tensor:
            if not higher:
                tensor = tensor.detach()
            found.append(tensor)
            return tensor

        with contextlib.ExitStack() as stack:
            if self.rng is not None:
                stack.enter_context(rng.replay(self.rng))
            for device_type, dtype, enabled in self.autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(keep, _identity))
            stack.enter_context(self.replay_ctx)
            stack.enter_context(_running_stats_frozen())
            self.fn(*args, **kwargs)
        _sync(o.stash.sync, devices)
        self._check(found)
        self.recomputed = dict(enumerate(found))
        if record is not None:
            record.add("recompute", time.perf_counter() - start, sum(t.numel() * t.element_size() for t in found))

    def _check(self, found: list[torch.Tensor]) -> None:
        shapes = [(t.shape, t.dtype) for t in found]
        if shapes != self.shapes:
            first = next(
                (i for i, (a, b) in enumerate(zip(shapes, self.shapes)) if a != b), min(len(shapes), len(self.shapes))
            )
            raise RuntimeError(
                f"{self.where}: the recomputation of the checkpointed region saved {len(shapes)} tensors where its "
                f"forward saved {len(self.shapes)} (first difference at tensor {first}); the region must take the "
                "same path every time it runs (no data- or state-dependent control flow beyond its inputs)"
            )


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _sync(enabled: bool, devices) -> None:
    if enabled:
        for device in sorted(devices, key=str):
            profiles.synchronize(device)


def _autocast_state() -> tuple:
    types = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    return tuple((t, torch.get_autocast_dtype(t), torch.is_autocast_enabled(t)) for t in types)


def _selective(save_ops: frozenset):
    """Dispatch modes for the forward (keeps outputs of `save_ops`) and the recomputation (hands them back)."""
    if not save_ops:
        return contextlib.nullcontext(), contextlib.nullcontext()
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(functools.partial(_policy, save_ops))


def _policy(save_ops: frozenset, ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    saved = op in save_ops or getattr(op, "overloadpacket", None) in save_ops
    return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def _running_stats_frozen():
    """BatchNorm layers re-run in the recomputation leave their running statistics as the forward left them, so
    they are updated once per step, not twice."""
    saved: dict[torch.nn.Module, list[torch.Tensor]] = {}

    def before(module, _args):
        if isinstance(module, BatchNormBase) and module.training and module.track_running_stats:
            saved[module] = [b.clone() for b in _stats(module)]

    def after(module, _args, _out):
        if module in saved:
            with torch.no_grad():
                for buffer, value in zip(_stats(module), saved.pop(module)):
                    buffer.copy_(value)

    hooks = (
        torch.nn.modules.module.register_module_forward_pre_hook(before),
        torch.nn.modules.module.register_module_forward_hook(after),
    )
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _stats(module: Any) -> list[torch.Tensor]:
    return [b for b in (module.running_mean, module.running_var, module.num_batches_tracked) if b is not None]


def _lowered(fn: Callable[..., Any], args: tuple, kwargs: dict, options: RegionOptions) -> Any:
    """The region as torch.compile sees it: torch's non-reentrant checkpoint (traced as one tagged region)."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if options.save_ops:  # dynamo takes context_fn only when one is given
        kwargs = dict(
            kwargs,
            context_fn=functools.partial(
                create_selective_checkpoint_contexts, functools.partial(_policy, options.save_ops)
            ),
        )
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=options.preserve_rng_state, **kwargs)
