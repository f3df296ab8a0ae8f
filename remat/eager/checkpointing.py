"""A drop-in for `deepspeed.checkpointing`: change the import, keep the calls.

    from remat import checkpointing            # was: import deepspeed.checkpointing as checkpointing
    checkpointing.configure(mpu, deepspeed_config="ds_config.json")
    hidden = checkpointing.checkpoint(layer, hidden, mask)

Everything runs on remat's runtime: partitioned inputs through ``remat::shard`` and an all-gather over the
model-parallel group, host copies through ``remat::offload``/``reload``, contiguous buffers from the runtime's arena
pool, timings into a runtime `Profile`. Where DeepSpeed is brittle this module is not: `checkpoint_in_cpu` and
`contiguous_checkpointing` work without `partition_activations`, the number of buffers is learned on the first step
when `num_checkpoints` is not given, and more checkpoints than buffers grow the pool instead of failing.
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
from .stash import Partition, StashOptions

__all__ = [
    "CheckpointFunction", "CudaRNGStatesTracker", "checkpoint", "configure", "get_cuda_rng_tracker", "get_profile",
    "is_configured", "model_parallel_cuda_manual_seed", "reset",
]

CudaRNGStatesTracker = RNGStatesTracker  # DeepSpeed's name; remat's tracker works on CPU and CUDA alike

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


@dataclasses.dataclass(frozen=True)
class Settings:
    """What `configure` set. Every field is off by default."""

    mpu: Any = None  # object with get_model_parallel_rank / _world_size / _group; None = no model parallelism
    partition_activations: bool = False  # keep 1/world of each checkpointed input per model-parallel rank
    contiguous_checkpointing: bool = False  # keep checkpointed inputs in arenas reused from step to step
    num_checkpoints: int | None = None  # checkpoints per step: arenas allocated up front; None = learned
    checkpoint_in_cpu: bool = False  # keep checkpointed inputs in host memory between forward and backward
    synchronize: bool = False  # wait for the device at the start and end of each checkpoint's forward and recompute
    profile: bool = False  # record time and bytes of recompute / offload / reload / gather / pack per step


_settings: Settings | None = None
_profile: Profile | None = None
_reserve: int | None = None  # arenas still to allocate up front (consumed by the first contiguous store)


def configure(mpu_: Any = None, deepspeed_config: dict | str | os.PathLike | None = None,
              partition_activations: bool | None = None, contiguous_checkpointing: bool | None = None,
              num_checkpoints: int | None = None, checkpoint_in_cpu: bool | None = None,
              synchronize: bool | None = None, profile: bool | None = None) -> None:
    """Set how `checkpoint` keeps its inputs. Arguments that are not None override the `activation_checkpointing`
    section of `deepspeed_config` (a dict, or the path of a JSON file); what neither sets is off."""
    global _settings, _profile, _reserve
    values = _read_section(deepspeed_config)
    given = dict(partition_activations=partition_activations, contiguous_checkpointing=contiguous_checkpointing,
                 num_checkpoints=num_checkpoints, checkpoint_in_cpu=checkpoint_in_cpu, synchronize=synchronize,
                 profile=profile)
    values.update({k: v for k, v in given.items() if v is not None})
    for name, value in values.items():
        if name != "num_checkpoints" and not isinstance(value, bool):
            raise TypeError(f"{name}={value!r}: expected True or False")
    count = values.get("num_checkpoints")
    if count is not None and (isinstance(count, bool) or not isinstance(count, numbers.Integral) or count <= 0):
        raise ValueError(f"num_checkpoints={count!r}: expected a positive int (checkpoints per step), or None to "
                         "learn the number of buffers on the first step")
    if mpu_ is not None:
        missing = [m for m in _MPU_METHODS if not callable(getattr(mpu_, m, None))]
        if missing:
            raise TypeError(f"mpu_={mpu_!r}: expected an object with methods {', '.join(_MPU_METHODS)}; "
                            f"it lacks {', '.join(missing)}")
    elif values.get("partition_activations"):
        raise ValueError("partition_activations=True: needs mpu_, the model-parallel unit (an object with "
                         f"{', '.join(_MPU_METHODS)}) whose group the activations are sharded over")
    _settings = Settings(mpu=mpu_, **values)
    _profile = Profile() if _settings.profile else None
    _reserve = _settings.num_checkpoints if _settings.contiguous_checkpointing else None


def _read_section(config: dict | str | os.PathLike | None) -> dict:
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        if not os.path.isfile(config):
            raise ValueError(f"deepspeed_config={str(config)!r}: no such file; pass the path of a DeepSpeed JSON "
                             "config, a dict, or None")
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
            raise ValueError(f"deepspeed_config[{_SECTION!r}] has unknown key {key!r}{hint}; accepted keys: "
                             f"{', '.join(_KEYS)}")
        if value is not None:
            values[_KEYS[key]] = value
    return values


def is_configured() -> bool:
    """True once `configure` has been called (and until the process ends)."""
    return _settings is not None


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


def checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)`, checkpointed: its activations are recomputed in backward from its inputs, kept as
    `configure` said. Returns what `function` returns."""
    global _reserve
    if not callable(function):
        raise TypeError(f"checkpoint(function={function!r}): expected a callable (a module or a function)")
    if torch.compiler.is_compiling():  # the compiled region is planned by remat; the keep-options are eager's
        return region.run(function, args, {}, region.DEFAULT, "remat.checkpointing.checkpoint")
    s = _settings or Settings()
    if _profile is not None and (not _profile.steps or _profile.steps[-1].calls["recompute"]):
        _profile.new_step()  # the first checkpoint after a backward starts a step
    partition = None
    if s.partition_activations:
        partition = Partition(s.mpu.get_model_parallel_rank(), s.mpu.get_model_parallel_world_size(),
                              s.mpu.get_model_parallel_group())
    stash = StashOptions(offload=s.checkpoint_in_cpu, partition=partition, contiguous=s.contiguous_checkpointing,
                         profile_id=_profile.id if _profile is not None else -1, sync=s.synchronize)
    reserve, _reserve = _reserve, None
    return region.run(function, args, {}, region.RegionOptions(stash=stash), "remat.checkpointing.checkpoint",
                      reserve)


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
    mpu = _settings.mpu if _settings is not None else None
    rank = mpu.get_model_parallel_rank() if mpu is not None else 0
    tracker = rng.TRACKER
    tracker.reset()
    rng.manual_seed(seed, tracker.device)
    tracker.add(MODEL_PARALLEL_RNG, seed + 2718 + rank)
