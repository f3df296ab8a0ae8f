"""The checkpointing calls of SageMaker smp, FairScale and modalities, on remat's region engine.

- smp: `checkpoint(module_or_fn, *args, **kwargs)`, `checkpoint_sequential(seq, input, strategy=...)`,
  `set_activation_checkpointing(module, ...)`.
- FairScale: `checkpoint_wrapper(module, offload_to_cpu=False, maintain_forward_counter=False)`.
- modalities: `apply_activation_checkpointing(model, variant, layers_fqn, ac_freq=None, save_ops=None)`; torch's
  `apply_activation_checkpointing(model, checkpoint_wrapper_fn=..., check_fn=..., auto_wrap_policy=...)` too.

Wrapping patches the module's `forward` in place (the module, its class and its state_dict keys stay the same) and
returns the module. Each wrapped forward is one region: recomputed once in backward, or traced as a marked region
inside torch.compile.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import re
import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .._torch import OpOverload, OpOverloadPacket
from ..config import resolve_op
from . import autowrap, region
from .region import RegionOptions
from .stash import StashOptions

__all__ = [
    "apply_activation_checkpointing",
    "checkpoint",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "set_activation_checkpointing",
]

_STRATEGY_RE = re.compile(r"group_([1-9]\d*)")
_STRATEGY_FORMS = "'each', 'contiguous' or 'group_N' with N a positive int (e.g. 'group_2')"
# modalities' default save set: matmuls, both fused attention kernels, max, reduce-scatter.
DEFAULT_SAVE_OPS = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten.max.default",
    "_c10d_functional.reduce_scatter_tensor.default",
)
_VARIANTS = {
    "full": "full",
    "full_activation_checkpointing": "full",
    "selective_layer": "selective_layer",
    "selective_layer_activation_checkpointing": "selective_layer",
    "selective_op": "selective_op",
    "selective_op_activation_checkpointing": "selective_op",
}


def checkpoint(module_or_fn: Callable[..., Any], *args: Any, preserve_rng_state: bool = True, **kwargs: Any) -> Any:
    """`module_or_fn(*args, **kwargs)` as one checkpointed region (smp.checkpoint)."""
    if not callable(module_or_fn):
        raise TypeError(f"checkpoint(module_or_fn={module_or_fn!r}): expected an nn.Module or a callable")
    return region.run(module_or_fn, args, kwargs, region.plain(preserve_rng_state), "remat.checkpoint")


def checkpoint_sequential(
    sequential: nn.Sequential,
    input: Any,
    strategy: str = "each",
    preserve_rng_state: bool = True,
    pack_args_as_tuple: bool = False,
) -> Any:
    """Run an nn.Sequential with its children grouped into checkpointed regions (smp.checkpoint_sequential):
    "each" child its own region, "group_N" N consecutive children per region, "contiguous" one region for all.
    A child's tuple output is unpacked into the next child's arguments unless `pack_args_as_tuple`."""
    if not isinstance(sequential, nn.Sequential):
        raise TypeError(
            f"checkpoint_sequential(sequential={type(sequential).__name__}): expected an nn.Sequential; "
            "wrap a single module with remat.checkpoint or remat.checkpoint_wrapper instead"
        )
    children = list(sequential)
    size = group_size(strategy, len(children))
    args = _as_args(input, pack_args_as_tuple)
    options = region.plain(preserve_rng_state)
    out = input
    for start in range(0, len(children), size):
        run_group = functools.partial(_run_children, tuple(children[start : start + size]), pack_args_as_tuple)
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


def set_activation_checkpointing(
    module: nn.Module, preserve_rng_state: bool = True, pack_args_as_tuple: bool = False, strategy: str = "each"
) -> nn.Module:
    """Checkpoint `module`'s forward from now on (smp.set_activation_checkpointing). An nn.Sequential runs its
    children by `strategy`; an nn.ModuleList has each layer checkpointed ("each" only: the list has no forward)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"set_activation_checkpointing(module={module!r}): expected an nn.Module")
    if isinstance(module, nn.ModuleList):
        if strategy != "each":
            group_size(strategy, len(module))
            raise ValueError(
                f"strategy={strategy!r}: an nn.ModuleList has no forward to group its layers in; "
                "use strategy='each', or put the layers in an nn.Sequential"
            )
        for layer in module:
            set_activation_checkpointing(layer, preserve_rng_state, pack_args_as_tuple, strategy)
        return module
    group_size(strategy, 1)
    sequential = isinstance(module, nn.Sequential)
    return _patch(
        module,
        Spec(
            "remat.set_activation_checkpointing",
            preserve_rng_state,
            strategy=strategy if sequential else None,
            pack_args_as_tuple=pack_args_as_tuple,
        ),
    )


def checkpoint_wrapper(
    module: nn.Module, offload_to_cpu: bool = False, maintain_forward_counter: bool = False
) -> nn.Module:
    """Checkpoint `module`'s forward (FairScale's checkpoint_wrapper): keyword and keyword-only arguments,
    non-tensor inputs and outputs pass through; with `offload_to_cpu` its inputs wait for backward in host memory.
    With `maintain_forward_counter` every submodule gets a `_checkpoint_fwd_counter`, raised by one per checkpointed
    forward and lowered by one per recomputation (FairScale's FSDP reads it; eager only). Both flags are taken by
    truth value, as FairScale does. Returns the same module."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"checkpoint_wrapper(module={module!r}): expected an nn.Module")
    if maintain_forward_counter:
        for child in module.modules():
            child._checkpoint_fwd_counter = 0  # type: ignore[assignment]  # nn.Module types attributes as Tensor | Module
    return _patch(
        module,
        Spec("remat.checkpoint_wrapper", offload=bool(offload_to_cpu), forward_counter=bool(maintain_forward_counter)),
    )


def apply_activation_checkpointing(
    model: nn.Module,
    variant: str | enum.Enum | Callable | None = None,
    layers_fqn: str | Callable | None = None,
    ac_freq: int | Any = None,
    save_ops: Iterable[Any] | None = None,
    *,
    checkpoint_wrapper_fn: Callable[..., nn.Module] | None = None,
    check_fn: Callable[[nn.Module], bool] | None = None,
    auto_wrap_policy: Any = None,
) -> nn.Module:
    """Checkpoint layers of `model`, in modalities' call form or in torch's; returns the model.

    modalities' form, `(model, variant, layers_fqn, ac_freq=None, save_ops=None)`: checkpoint the layers of the
    nn.ModuleList at `layers_fqn`: "full" every layer, "selective_layer" every `ac_freq`-th (layers ac_freq-1,
    2*ac_freq-1, ...), "selective_op" every layer but the outputs of `save_ops` are saved rather than recomputed
    (default: mm, both fused attention kernels, max, reduce_scatter).

    torch's form, `(model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda _: True,
    auto_wrap_policy=None)` (torch.distributed.algorithms._checkpoint.checkpoint_wrapper's; also positionally, or
    with no argument but the model): every submodule (not the root) for which `check_fn` is true, or which
    `auto_wrap_policy` selects, is replaced by `checkpoint_wrapper_fn(submodule)`, children first. The default
    wrapper is remat's `checkpoint_wrapper`; another callable (torch's own wrapper, say) is used as given.
    """
    torch_form: tuple[Any, Any, Any] = (checkpoint_wrapper_fn, check_fn, auto_wrap_policy)
    if callable(variant) and not isinstance(variant, (str, enum.Enum)):  # torch's form, positionally
        if any(a is not None for a in torch_form) or save_ops is not None:
            raise TypeError(
                "apply_activation_checkpointing: torch's form takes (model, checkpoint_wrapper_fn, "
                "check_fn, auto_wrap_policy) positionally or by keyword, not both"
            )
        torch_form, variant, layers_fqn, ac_freq = (variant, layers_fqn, ac_freq), None, None, None
    modalities_form = {"variant": variant, "layers_fqn": layers_fqn, "ac_freq": ac_freq, "save_ops": save_ops}
    given = [f"{k}={v!r}" for k, v in modalities_form.items() if v is not None]
    if variant is None:
        if given:
            raise TypeError(
                f"apply_activation_checkpointing({', '.join(given)}): modalities' form needs variant "
                "('full', 'selective_layer' or 'selective_op') and layers_fqn"
            )
        wrapper_fn, check, policy = torch_form
        return autowrap.apply(model, checkpoint_wrapper if wrapper_fn is None else wrapper_fn, check, policy)
    if any(a is not None for a in torch_form):
        names = [
            n for n, a in zip(("checkpoint_wrapper_fn", "check_fn", "auto_wrap_policy"), torch_form) if a is not None
        ]
        raise TypeError(
            f"apply_activation_checkpointing: {', '.join(names)} (torch's form) cannot be combined with "
            f"variant={variant!r} (modalities' form); call apply_activation_checkpointing(model, variant, "
            "layers_fqn, ac_freq=..., save_ops=...) or apply_activation_checkpointing(model, "
            "checkpoint_wrapper_fn=..., check_fn=..., auto_wrap_policy=...)"
        )
    if not isinstance(layers_fqn, str):
        raise TypeError(
            f"layers_fqn={layers_fqn!r}: variant {variant!r} needs layers_fqn, the path of the "
            "nn.ModuleList of layers, e.g. 'transformer.h'"
        )
    kind = _variant(variant)
    try:
        layers = model.get_submodule(layers_fqn)
    except AttributeError as exc:
        raise ValueError(f"layers_fqn={layers_fqn!r}: {exc}") from None
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"layers_fqn={layers_fqn!r} is a {type(layers).__name__}; expected the path of an "
            "nn.ModuleList of layers, e.g. 'transformer.h'"
        )
    if ac_freq is not None and (isinstance(ac_freq, bool) or not isinstance(ac_freq, int) or ac_freq <= 0):
        raise ValueError(f"ac_freq={ac_freq!r}: expected a positive int (checkpoint every ac_freq-th layer)")
    if kind == "selective_layer" and ac_freq is None:
        raise ValueError("ac_freq=None: variant 'selective_layer' needs ac_freq, a positive int")
    saved = _save_set(DEFAULT_SAVE_OPS if save_ops is None else save_ops) if kind == "selective_op" else ()
    spec = Spec(f"remat.apply_activation_checkpointing({kind})", save_ops=saved)
    period = 1 if ac_freq is None else ac_freq  # checked above: set for "selective_layer"
    for index, layer in enumerate(layers):
        if kind == "selective_layer" and (index + 1) % period:
            continue
        _patch(layer, spec)
    return model


def _variant(variant: str | enum.Enum) -> str:
    name = variant
    if isinstance(variant, enum.Enum):
        name = variant.value if isinstance(variant.value, str) else variant.name
    key = name.lower() if isinstance(name, str) else None
    if key not in _VARIANTS:
        raise ValueError(
            f"variant={variant!r}: expected 'full', 'selective_layer' or 'selective_op' (or "
            "FULL_/SELECTIVE_LAYER_/SELECTIVE_OP_ACTIVATION_CHECKPOINTING)"
        )
    return _VARIANTS[key]


def _save_set(save_ops: Iterable[Any]) -> tuple[str, ...]:
    """The save ops as checked, sorted op names."""
    if isinstance(save_ops, (str, OpOverload, OpOverloadPacket)):
        save_ops = [save_ops]
    entries = list(save_ops)
    if not entries:
        raise ValueError(
            "save_ops=[]: an empty save set recomputes everything, which is variant 'full'; pass op "
            "names such as ['aten.mm'], or None for the default set"
        )
    names = set()
    for entry in entries:
        if isinstance(entry, str) and entry.startswith("ops."):
            entry = entry[len("ops.") :]  # modalities' save_ops_keys: "ops.aten.mm.default"
        try:
            names.add(str(resolve_op(entry)))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"save_ops: {exc}") from None
    return tuple(sorted(names))


@dataclasses.dataclass(frozen=True)
class Spec:
    """How a wrapped module's forward is checkpointed: plain data, so the wrapping copies and pickles."""

    where: str  # the API that wrapped it, for messages
    preserve_rng_state: bool = True
    offload: bool = False
    save_ops: tuple[str, ...] = ()  # op names ("aten.mm.default") whose outputs are saved
    strategy: str | None = None  # an nn.Sequential run by checkpoint_sequential with this strategy
    pack_args_as_tuple: bool = False
    forward_counter: bool = False  # keep FairScale's _checkpoint_fwd_counter on the module's submodules


class CheckpointedForward:
    """A module's forward, checkpointed; set as the instance's `forward`. It refers to its module weakly (no
    cycle), is copied with it by copy.deepcopy (the copy runs the copied module) and pickles with it."""

    def __init__(self, module: nn.Module, spec: Spec, inner: Callable[..., Any] | None = None):
        self._module = weakref.ref(module)
        self.spec = spec
        self.inner = inner  # a forward set on the instance before remat's, if any
        self.options = RegionOptions(
            preserve_rng_state=spec.preserve_rng_state,
            stash=StashOptions(offload=spec.offload),
            save_ops=frozenset(resolve_op(name) for name in spec.save_ops),
        )

    def _live_module(self) -> nn.Module:
        module = self._module()
        if module is None:
            raise RuntimeError(f"{self.spec.where}: the module whose forward this is no longer exists")
        return module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, s = self._live_module(), self.spec
        if s.strategy is not None:
            assert isinstance(module, nn.Sequential)  # strategy is set for nn.Sequential only
            (x,) = args  # nn.Sequential's forward takes one input
            return checkpoint_sequential(
                module,
                x,
                strategy=s.strategy,
                preserve_rng_state=s.preserve_rng_state,
                pack_args_as_tuple=s.pack_args_as_tuple,
            )
        original = self.inner if self.inner is not None else functools.partial(type(module).forward, module)
        if (
            s.forward_counter
            and torch.is_grad_enabled()
            and not torch.is_inference_mode_enabled()
            and not torch.compiler.is_compiling()
        ):
            original = _ForwardCounter(module, original)
        return region.run(original, args, kwargs, self.options, s.where)

    def __deepcopy__(self, memo: dict) -> "CheckpointedForward":
        module = self._live_module()
        return CheckpointedForward(memo.get(id(module), module), self.spec, copy.deepcopy(self.inner, memo))

    def __reduce__(self):
        return CheckpointedForward, (self._module(), self.spec, self.inner)


class _ForwardCounter:
    """One region's forward: its first run adds 1 to each submodule's `_checkpoint_fwd_counter`, its
    recomputation in backward subtracts 1, so the counter says how many forwards still await their backward."""

    def __init__(self, module: nn.Module, forward: Callable[..., Any]):
        self.module, self.forward, self.ran = module, forward, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.forward(*args, **kwargs)
        step = -1 if self.ran else 1
        self.ran = True
        for child in self.module.modules():
            if hasattr(child, "_checkpoint_fwd_counter"):
                child._checkpoint_fwd_counter += step  # type: ignore[operator,assignment]  # an int, not Tensor | Module
        return out


def _patch(module: nn.Module, spec: Spec) -> nn.Module:
    """Checkpoint `module`'s forward as `spec` says; wrapping twice replaces the first wrapping."""
    existing = module.__dict__.get("forward")
    inner = existing.inner if isinstance(existing, CheckpointedForward) else existing
    module.forward = CheckpointedForward(module, spec, inner)
    return module
