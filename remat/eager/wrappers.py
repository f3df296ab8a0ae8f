"""The checkpointing calls of SageMaker smp, FairScale and modalities, on remat's region engine.

- smp: `checkpoint(module_or_fn, *args, **kwargs)`, `checkpoint_sequential(seq, input, strategy=...)`,
  `set_activation_checkpointing(module, ...)`.
- FairScale: `checkpoint_wrapper(module, offload_to_cpu=False)`.
- modalities: `apply_activation_checkpointing(model, variant, layers_fqn, ac_freq=None, save_ops=None)`.

Wrapping patches the module's `forward` in place (the module, its class and its state_dict keys stay the same) and
returns the module. Each wrapped forward is one region: recomputed once in backward, or traced as a marked region
inside torch.compile.
"""
from __future__ import annotations

import enum
import functools
import re
import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..config import resolve_op
from . import region
from .region import RegionOptions
from .stash import StashOptions

__all__ = ["apply_activation_checkpointing", "checkpoint", "checkpoint_sequential", "checkpoint_wrapper",
           "set_activation_checkpointing"]

_STRATEGY_RE = re.compile(r"group_([1-9]\d*)")
_STRATEGY_FORMS = "'each', 'contiguous' or 'group_N' with N a positive int (e.g. 'group_2')"
# modalities' default save set: matmuls, both fused attention kernels, max, reduce-scatter.
DEFAULT_SAVE_OPS = ("aten.mm.default", "aten._scaled_dot_product_efficient_attention.default",
                    "aten._scaled_dot_product_flash_attention.default", "aten.max.default",
                    "_c10d_functional.reduce_scatter_tensor.default")
_VARIANTS = {
    "full": "full", "full_activation_checkpointing": "full",
    "selective_layer": "selective_layer", "selective_layer_activation_checkpointing": "selective_layer",
    "selective_op": "selective_op", "selective_op_activation_checkpointing": "selective_op",
}


def checkpoint(module_or_fn: Callable[..., Any], *args: Any, preserve_rng_state: bool = True, **kwargs: Any) -> Any:
    """`module_or_fn(*args, **kwargs)` as one checkpointed region (smp.checkpoint)."""
    if not callable(module_or_fn):
        raise TypeError(f"checkpoint(module_or_fn={module_or_fn!r}): expected an nn.Module or a callable")
    return region.run(module_or_fn, args, kwargs, region.plain(preserve_rng_state), "remat.checkpoint")


def checkpoint_sequential(sequential: nn.Sequential, input: Any, strategy: str = "each",
                          preserve_rng_state: bool = True, pack_args_as_tuple: bool = False) -> Any:
    """Run an nn.Sequential with its children grouped into checkpointed regions (smp.checkpoint_sequential):
    "each" child its own region, "group_N" N consecutive children per region, "contiguous" one region for all.
    A child's tuple output is unpacked into the next child's arguments unless `pack_args_as_tuple`."""
    if not isinstance(sequential, nn.Sequential):
        raise TypeError(f"checkpoint_sequential(sequential={type(sequential).__name__}): expected an nn.Sequential; "
                        "wrap a single module with remat.checkpoint or remat.checkpoint_wrapper instead")
    children = list(sequential)
    size = group_size(strategy, len(children))
    args = _as_args(input, pack_args_as_tuple)
    options = region.plain(preserve_rng_state)
    out = input
    for start in range(0, len(children), size):
        run_group = functools.partial(_run_children, tuple(children[start:start + size]), pack_args_as_tuple)
        out = region.run(run_group, args, {}, options, "remat.checkpoint_sequential")
        args = _as_args(out, pack_args_as_tuple)
    return out


def group_size(strategy: str, count: int) -> int:
    """Children per region for an smp strategy name."""
    if strategy == "each":
        return 1
    if strategy == "contiguous":
        return max(count, 1)
    match = _STRATEGY_RE.fullmatch(strategy) if isinstance(strategy, str) else None
    if match is None:
        raise ValueError(f"strategy={strategy!r}: expected {_STRATEGY_FORMS}")
    return int(match.group(1))


def _as_args(value: Any, packed: bool) -> tuple:
    return value if isinstance(value, tuple) and not packed else (value,)


def _run_children(children: tuple[nn.Module, ...], packed: bool, *args: Any) -> Any:
    out = None
    for child in children:
        out = child(*args)
        args = _as_args(out, packed)
    return out


def set_activation_checkpointing(module: nn.Module, preserve_rng_state: bool = True, pack_args_as_tuple: bool = False,
                                 strategy: str = "each") -> nn.Module:
    """Checkpoint `module`'s forward from now on (smp.set_activation_checkpointing). An nn.Sequential runs its
    children by `strategy`; an nn.ModuleList has each layer checkpointed ("each" only: the list has no forward)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"set_activation_checkpointing(module={module!r}): expected an nn.Module")
    if isinstance(module, nn.ModuleList):
        if strategy != "each":
            group_size(strategy, len(module))
            raise ValueError(f"strategy={strategy!r}: an nn.ModuleList has no forward to group its layers in; "
                             "use strategy='each', or put the layers in an nn.Sequential")
        for layer in module:
            set_activation_checkpointing(layer, preserve_rng_state, pack_args_as_tuple, strategy)
        return module
    group_size(strategy, 1)
    if isinstance(module, nn.Sequential):
        def forward(seq: nn.Module, _original: Any, input: Any) -> Any:
            return checkpoint_sequential(seq, input, strategy, preserve_rng_state, pack_args_as_tuple)

        return _patch(module, forward)
    return _patch(module, _region_forward(region.plain(preserve_rng_state), "remat.set_activation_checkpointing"))


def checkpoint_wrapper(module: nn.Module, offload_to_cpu: bool = False) -> nn.Module:
    """Checkpoint `module`'s forward (FairScale's checkpoint_wrapper): keyword and keyword-only arguments,
    non-tensor inputs and outputs pass through; with `offload_to_cpu` its inputs wait for backward in host memory.
    Returns the same module."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"checkpoint_wrapper(module={module!r}): expected an nn.Module")
    if not isinstance(offload_to_cpu, bool):
        raise TypeError(f"offload_to_cpu={offload_to_cpu!r}: expected True or False")
    options = RegionOptions(stash=StashOptions(offload=offload_to_cpu))
    return _patch(module, _region_forward(options, "remat.checkpoint_wrapper"))


def apply_activation_checkpointing(model: nn.Module, variant: str | enum.Enum, layers_fqn: str,
                                   ac_freq: int | None = None, save_ops: Iterable[Any] | None = None) -> nn.Module:
    """Checkpoint the layers of the nn.ModuleList at `layers_fqn` (modalities): "full" every layer,
    "selective_layer" every `ac_freq`-th (layers ac_freq-1, 2*ac_freq-1, ...), "selective_op" every layer but the
    outputs of `save_ops` are saved rather than recomputed (default: mm, both fused attention kernels, max,
    reduce_scatter). Returns the model."""
    kind = _variant(variant)
    try:
        layers = model.get_submodule(layers_fqn)
    except AttributeError as exc:
        raise ValueError(f"layers_fqn={layers_fqn!r}: {exc}") from None
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"layers_fqn={layers_fqn!r} is a {type(layers).__name__}; expected the path of an "
                        "nn.ModuleList of layers, e.g. 'transformer.h'")
    if ac_freq is not None and (isinstance(ac_freq, bool) or not isinstance(ac_freq, int) or ac_freq <= 0):
        raise ValueError(f"ac_freq={ac_freq!r}: expected a positive int (checkpoint every ac_freq-th layer)")
    if kind == "selective_layer" and ac_freq is None:
        raise ValueError("ac_freq=None: variant 'selective_layer' needs ac_freq, a positive int")
    options = RegionOptions()
    if kind == "selective_op":
        options = RegionOptions(save_ops=_save_set(DEFAULT_SAVE_OPS if save_ops is None else save_ops))
    for index, layer in enumerate(layers):
        if kind == "selective_layer" and (index + 1) % ac_freq:
            continue
        _patch(layer, _region_forward(options, f"remat.apply_activation_checkpointing({kind})"))
    return model


def _variant(variant: str | enum.Enum) -> str:
    name = variant
    if isinstance(variant, enum.Enum):
        name = variant.value if isinstance(variant.value, str) else variant.name
    key = name.lower() if isinstance(name, str) else None
    if key not in _VARIANTS:
        raise ValueError(f"variant={variant!r}: expected 'full', 'selective_layer' or 'selective_op' (or "
                         "FULL_/SELECTIVE_LAYER_/SELECTIVE_OP_ACTIVATION_CHECKPOINTING)")
    return _VARIANTS[key]


def _save_set(save_ops: Iterable[Any]) -> frozenset:
    if isinstance(save_ops, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        save_ops = [save_ops]
    entries = list(save_ops)
    if not entries:
        raise ValueError("save_ops=[]: an empty save set recomputes everything, which is variant 'full'; pass op "
                         "names such as ['aten.mm'], or None for the default set")
    ops = set()
    for entry in entries:
        try:
            ops.add(resolve_op(entry))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"save_ops: {exc}") from None
    return frozenset(ops)


def _region_forward(options: RegionOptions, where: str) -> Callable[..., Any]:
    def forward(module: nn.Module, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return region.run(original, args, kwargs, options, where)

    return forward


def _patch(module: nn.Module, body: Callable[..., Any]) -> nn.Module:
    """Make `body(module, original_forward, *args, **kwargs)` the module's forward. The instance holds only a weak
    reference to itself; wrapping twice replaces the first wrapping."""
    existing = module.__dict__.get("forward")
    inner = getattr(existing, "__remat_inner__", existing)  # a forward set on the instance before remat's
    ref = weakref.ref(module)

    def forward(*args: Any, **kwargs: Any) -> Any:
        owner = ref()
        original = inner if inner is not None else functools.partial(type(owner).forward, owner)
        return body(owner, original, *args, **kwargs)

    forward.__remat_inner__ = inner  # type: ignore[attr-defined]
    module.forward = forward
    return module
