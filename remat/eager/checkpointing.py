"""A drop-in for `deepspeed.checkpointing`: change the import, keep the calls.

    from remat import checkpointing            # was: import deepspeed.checkpointing as checkpointing
    checkpointing.configure(mpu, deepspeed_config="ds_config.json")
    hidden = checkpointing.checkpoint(layer, hidden, mask)

Everything runs on remat's runtime: sharded inputs (partition_activations) through ``remat::shard`` and an
all-gather over the model-parallel group, host copies through ``remat::offload``/``reload``, contiguous buffers from
the runtime's arena pool, timings into a runtime `Profile`. Where DeepSpeed is brittle this module is not:
`checkpoint_in_cpu` and `contiguous_checkpointing` work without `partition_activations`, the number of buffers is
learned on the first step when `num_checkpoints` is not given, and more checkpoints than buffers grow the pool
instead of failing.

Every public name of `deepspeed.checkpointing` a model calls is here. DeepSpeed's internal helpers (partitioning,
offload bookkeeping) and its module-level state variables are not: reading one raises an AttributeError that says
what to call instead (`get_settings()` reads the state).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import numbers
import os
from typing import Any, Callable

import torch

from ..runtime import buffers, rng
from ..runtime.profile import Profile
from ..runtime.rng import MODEL_PARALLEL_RNG, RNGStatesTracker
from . import region
from .stash import ShardGroup, StashOptions
from .not_offered import NOT_OFFERED

__all__ = [
    "CheckpointFunction",
    "CudaRNGStatesTracker",
    "checkpoint",
    "configure",
    "detach_variable",
    "get_cuda_rng_tracker",
    "get_profile",
    "get_settings",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "model_parallel_reconfigure_tp_seed",
    "non_reentrant_checkpoint",
    "partition_activations_in_checkpoint",
    "reset",
    "set_num_layers",
]

CudaRNGStatesTracker = RNGStatesTracker  # DeepSpeed's name; remat's tracker works on CPU and CUDA alike
# DeepSpeed's private names that Megatron-style code imports (GPT-NeoX's mpu/random.py does).
_MODEL_PARALLEL_RNG_TRACKER_NAME = MODEL_PARALLEL_RNG
_CUDA_RNG_STATE_TRACKER = rng.TRACKER

# The `activation_checkpointing` section of a DeepSpeed config: JSON key → configure() argument.
_SECTION = "activation_checkpointing"
_KEYS = {
    "partition_activations": "partition_activations",
    "contiguous_memory_optimization": "contiguous_checkpointing",
    "number_checkpoints": "num_checkpoints",
    "cpu_checkpointing": "checkpoint_in_cpu",
    "synchronize_checkpoint_boundary": "synchronize",
    "profile": "profile",
}
_MPU_METHODS = ("get_model_parallel_rank", "get_model_parallel_world_size", "get_model_parallel_group")
# Megatron's mpu names the tensor-parallel group so; DeepSpeed prefers them when present, and so does remat.
_TP_METHODS = (
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tensor_model_parallel_group",
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What `configure` set. Every field is off by default."""

    mpu: Any = None  # object with get_[tensor_]model_parallel_rank / _world_size / _group; None = no model parallelism
    partition_activations: bool = False  # keep 1/world of each checkpointed input per model-parallel rank; no mpu: all
    contiguous_checkpointing: bool = False  # keep checkpointed inputs in arenas reused from step to step
    num_checkpoints: int | None = None  # checkpoints per step: arenas allocated up front; None = learned
    checkpoint_in_cpu: bool = False  # keep checkpointed inputs in host memory between forward and backward
    synchronize: bool = False  # wait for the device at the start and end of each checkpoint's forward and recompute
    profile: bool = False  # record time and bytes of recompute / offload / reload / shard / gather / pack per step


_settings: Settings | None = None  # None until `configure` (or a setter below) sets something
_configured = False  # `configure` was called (the setters alone do not count, as in DeepSpeed)
_profile: Profile | None = None
_reserve: int | None = None  # arenas still to allocate up front (consumed by the first contiguous store)


def configure(
    mpu_: Any = None,
    deepspeed_config: dict | str | os.PathLike | None = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
) -> None:
    """Set how `checkpoint` keeps its inputs. Arguments that are not None override the `activation_checkpointing`
    section of `deepspeed_config` (a dict, or the path of a JSON file); what neither sets is off."""
    global _settings, _profile, _reserve, _configured
    values = _read_section(deepspeed_config)
    given = dict(
        partition_activations=partition_activations,
        contiguous_checkpointing=contiguous_checkpointing,
        num_checkpoints=num_checkpoints,
        checkpoint_in_cpu=checkpoint_in_cpu,
        synchronize=synchronize,
        profile=profile,
    )
    values.update({k: v for k, v in given.items() if v is not None})
    for name, value in values.items():
        if name != "num_checkpoints" and not isinstance(value, bool):
            raise TypeError(f"{name}={value!r}: expected True or False")
    count = values.get("num_checkpoints")
    if count is not None and (isinstance(count, bool) or not isinstance(count, numbers.Integral) or count <= 0):
        raise ValueError(
            f"num_checkpoints={count!r}: expected a positive int (checkpoints per step), or None to "
            "learn the number of buffers on the first step"
        )
    if mpu_ is not None and _mpu_methods(mpu_) is None:
        missing = [m for m in _MPU_METHODS if not callable(getattr(mpu_, m, None))]
        raise TypeError(
            f"mpu_={mpu_!r}: expected an object with methods {', '.join(_MPU_METHODS)} (or "
            f"{', '.join(_TP_METHODS)}); it lacks {', '.join(missing)}"
        )
    _settings = Settings(mpu=mpu_, **values)
    _configured = True
    _profile = Profile() if _settings.profile else None
    _reserve = _settings.num_checkpoints if _settings.contiguous_checkpointing else None


def _mpu_methods(mpu: Any) -> tuple[str, str, str] | None:
    """The rank / world size / group method names `mpu` has: the tensor-parallel ones first, as DeepSpeed."""
    for names in (_TP_METHODS, _MPU_METHODS):
        if all(callable(getattr(mpu, m, None)) for m in names):
            return names
    return None


def _model_parallel(mpu: Any) -> ShardGroup | None:
    """The group `mpu` shards over; None without model parallelism (one shard: the whole tensor)."""
    if mpu is None:
        return None
    methods = _mpu_methods(mpu)
    assert methods is not None  # checked where mpu is given
    rank, world, group = (getattr(mpu, m)() for m in methods)
    return ShardGroup(rank, world, group)


def _read_section(config: dict | str | os.PathLike | None) -> dict:
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        if not os.path.isfile(config):
            raise ValueError(
                f"deepspeed_config={str(config)!r}: no such file; pass the path of a DeepSpeed JSON "
                "config, a dict, or None"
            )
        with open(config) as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise TypeError(f"deepspeed_config={config!r}: expected a dict, the path of a JSON file, or None")
    section = config.get(_SECTION) or {}
    if not isinstance(section, dict):
        raise TypeError(f"deepspeed_config[{_SECTION!r}]={section!r}: expected a dict of {', '.join(_KEYS)}")
    values = {}
    for key, value in section.items():
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"deepspeed_config[{_SECTION!r}] has unknown key {key!r}{hint}; accepted keys: {', '.join(_KEYS)}"
            )
        if value is not None:
            values[_KEYS[key]] = value
    return values


def is_configured() -> bool:
    """True once `configure` has been called (and until the process ends)."""
    return _configured


def get_settings() -> Settings:
    """What `configure` and the setters set (all off before either is called)."""
    return _settings or Settings()


def set_num_layers(nlayers: int) -> None:
    """Set `num_checkpoints`, the checkpoints per step that contiguous buffers are allocated for up front."""
    global _settings, _reserve
    if isinstance(nlayers, bool) or not isinstance(nlayers, numbers.Integral) or nlayers <= 0:
        raise ValueError(f"set_num_layers(nlayers={nlayers!r}): expected a positive int (checkpoints per step)")
    _settings = dataclasses.replace(get_settings(), num_checkpoints=int(nlayers))
    _reserve = _settings.num_checkpoints if _settings.contiguous_checkpointing else None


def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    """Turn `partition_activations` on or off, keeping the rest of the settings."""
    global _settings
    if not isinstance(partition_activation, bool):
        raise TypeError(
            f"partition_activations_in_checkpoint(partition_activation={partition_activation!r}): "
            "expected True or False"
        )
    _settings = dataclasses.replace(get_settings(), partition_activations=partition_activation)


def get_profile() -> Profile | None:
    """The per-step record of checkpoint work when configured with profile=True, else None."""
    return _profile


def reset() -> None:
    """Release the contiguous buffers no checkpoint still uses and start the next step afresh. Call it after
    forwards that had no backward (evaluation with grad enabled) before training again."""
    global _reserve
    buffers.POOL.trim()
    if _settings is not None and _settings.contiguous_checkpointing:
        _reserve = _settings.num_checkpoints
    if _profile is not None and _profile.steps:
        _profile.new_step()


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)`, checkpointed: its activations are recomputed in backward from its inputs (tensors
    passed by keyword included), kept as `configure` said. Returns what `function` returns."""
    return _run(function, args, kwargs, "remat.checkpointing.checkpoint")


def non_reentrant_checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """DeepSpeed's non-reentrant variant, for regions none of whose inputs requires grad (only parameters do).
    remat's `checkpoint` is non-reentrant already and handles that case; this is the same call."""
    return _run(function, args, kwargs, "remat.checkpointing.non_reentrant_checkpoint")


def _run(function: Callable[..., Any], args: tuple, kwargs: dict, where: str) -> Any:
    global _reserve
    if not callable(function):
        raise TypeError(
            f"{where.rsplit('.', 1)[-1]}(function={function!r}): expected a callable (a module or a function)"
        )
    if torch.compiler.is_compiling():  # the compiled region is planned by remat; the keep-options are eager's
        return region.run(function, args, kwargs, region.DEFAULT, where)
    s = get_settings()
    if _profile is not None and (not _profile.steps or _profile.steps[-1].calls["recompute"]):
        _profile.new_step()  # the first checkpoint after a backward starts a step
    shards = _model_parallel(s.mpu) if s.partition_activations else None
    stash = StashOptions(
        offload=s.checkpoint_in_cpu,
        shard=shards,
        contiguous=s.contiguous_checkpointing,
        profile_id=_profile.id if _profile is not None else -1,
        sync=s.synchronize,
        call_site=_call_site(function) if shards is not None else None,
    )
    reserve, _reserve = _reserve, None
    return region.run(function, args, kwargs, region.RegionOptions(stash=stash), where, reserve)


def _call_site(function: Callable[..., Any]) -> Any:
    """What stays the same across calls of one checkpointed function: its code (a closure made anew per call keeps
    it), or its class's forward for a module."""
    code = getattr(function, "__code__", None)
    if code is not None:
        return code
    forward = getattr(type(function), "forward", None)
    return getattr(forward, "__code__", None) or type(function)


class CheckpointFunction:
    """DeepSpeed's entry point: `CheckpointFunction.apply(function, all_outputs, *args)` runs `checkpoint` and
    appends the outputs to the list `all_outputs` (a tuple's items one by one)."""

    @staticmethod
    def apply(function: Callable[..., Any], all_outputs: list, *args: Any) -> Any:
        out = checkpoint(function, *args)
        all_outputs.extend(out if isinstance(out, tuple) else (out,))
        return out


def get_cuda_rng_tracker() -> RNGStatesTracker:
    """The process's named random streams (model-parallel dropout forks one)."""
    return rng.TRACKER


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the default stream with `seed` (the same on every model-parallel rank) and the model-parallel stream
    with `seed + 2718 + rank`, so each model-parallel rank draws its own numbers inside `fork()`."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"model_parallel_cuda_manual_seed(seed={seed!r}): expected an int")
    tracker = rng.TRACKER
    tracker.reset()
    rng.manual_seed(seed, tracker.device)
    tracker.add(MODEL_PARALLEL_RNG, seed + 2718 + _model_parallel_rank())


def model_parallel_reconfigure_tp_seed(seed: int) -> None:
    """Re-seed only the model-parallel stream with `seed + 2718 + rank` (the default stream is left as it is)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"model_parallel_reconfigure_tp_seed(seed={seed!r}): expected an int")
    tracker = rng.TRACKER
    if MODEL_PARALLEL_RNG not in tracker.get_states():
        raise ValueError(
            f"model_parallel_reconfigure_tp_seed(seed={seed}): there is no model-parallel stream to "
            "re-seed; call model_parallel_cuda_manual_seed(seed) first"
        )
    with tracker.fork(MODEL_PARALLEL_RNG):
        rng.manual_seed(seed + 2718 + _model_parallel_rank(), tracker.device)


def _model_parallel_rank() -> int:
    shards = _model_parallel(get_settings().mpu)
    return shards.rank if shards is not None else 0


def detach_variable(inputs: tuple, device: torch.device | str | None = None) -> tuple:
    """`inputs` with each tensor detached (moved to `device` first if given), keeping its requires_grad; other
    items pass through."""
    if not isinstance(inputs, tuple):
        raise TypeError(f"detach_variable(inputs={type(inputs).__name__}): expected a tuple")
    out = []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            moved = item.to(device) if device is not None else item
            item = moved.detach().requires_grad_(item.requires_grad)
        out.append(item)
    return tuple(out)


def _set_cuda_rng_state(new_state: torch.Tensor, device: int | str | torch.device = -1) -> None:
    """Set a device's generator state; -1 is the tracker's device (the current CUDA device, else the CPU)."""
    if isinstance(device, int):
        device = rng.default_device() if device == -1 else torch.device("cuda", device)
    rng.set_state(new_state, torch.device(device))


def __getattr__(name: str) -> Any:
    if name in NOT_OFFERED:
        raise AttributeError(f"remat.checkpointing.{name}: DeepSpeed's {name} is not offered; {NOT_OFFERED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
