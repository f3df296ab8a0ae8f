"""The torch.compile backend: `torch.compile(model, backend="remat", options={...})`.

aot_autograd traces the joint forward+backward graph and hands it to remat's partition function, which plans it and
splits it into the forward and backward modules that the inner compiler (inductor, aot_eager or eager) compiles.
With inductor the partition function plugs into inductor's custom-partitioner hook, so inductor's joint-graph passes
run first; on a torch without that hook remat drives aot_autograd itself with inductor's inner compiler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx

from . import _torch
from .logs import log_plan
from .capture import hooked_nodes
from .code_version import code_version
from .config import RematConfig
from .environ import config_from_environment
from .pipeline import Planned, plan_joint, shard_group
from .plan.agree import check_ranks_agree
from .rewrite.transfer import Runtime
from .runtime import table
from .runtime.profile import Profile
from .plan.plan import Plan
from .rewrite.split import split
from .step import Slot, StepLedger, input_shapes, plan_in_step

_plans: list[Plan] = []
_graphs: list[tuple[fx.GraphModule, fx.GraphModule]] = []
_arena_keys = itertools.count()  # one arena key per compiled graph


def last_plan() -> Plan:
    """The Plan of the most recent graph remat compiled (the last one when a model compiles to several graphs)."""
    if not _plans:
        raise RuntimeError("remat.last_plan(): nothing has been compiled with remat yet; call the compiled model once")
    return _plans[-1]


def recent_plans() -> tuple[Plan, ...]:
    """The Plans of the graphs compiled most recently, oldest first (at most 64 are kept). Under a byte budget, each
    Plan's `step_share` tells how the step's budget was split for its graph (remat/step.py)."""
    return tuple(_plans)


def last_graphs() -> tuple[fx.GraphModule, fx.GraphModule]:
    """The (forward, backward) modules remat built for the most recent graph, before the inner compiler: read
    `.code` to see every save, recompute, offload/reload, shard/gather and arena store."""
    if not _graphs:
        raise RuntimeError(
            "remat.last_graphs(): nothing has been compiled with remat yet; call the compiled model once"
        )
    return _graphs[-1]


def _record(plan: Plan) -> None:
    _plans.append(plan)
    del _plans[:-64]


class Partitioner:
    """remat's partition function: plans the joint graph and returns (forward module, backward module)."""

    def __init__(
        self,
        config: RematConfig,
        hooked: frozenset[str] = frozenset(),
        step: StepLedger | None = None,
        followed: bool = False,
    ):
        self.config = config
        self.hooked = hooked  # dynamo-graph nodes with tensor hooks: saved, never recomputed
        self.step = step  # the graphs of the step this graph belongs to (remat/step.py); None: planned alone
        self.followed = followed  # more graphs of the step run after this one (it ends at a graph break)
        self.slot: Slot | None = None  # this graph's place in that step, once planned

    def __call__(
        self,
        joint: fx.GraphModule,
        joint_inputs: Sequence[Any],
        *,
        num_fwd_outputs: int,
        static_lifetime_input_indices: Sequence[int] | None = None,
        **_: Any,
    ):
        config = self.config
        planned = self.plan(joint, num_fwd_outputs, static_lifetime_input_indices)
        plan = planned.plan
        group = shard_group(config)
        if group is not None:
            check_ranks_agree(plan, group)
        profile = Profile() if config.profile else None
        if profile is not None:
            plan = dataclasses.replace(plan, profile=profile)
        _record(plan)
        log_plan(plan)
        runtime = Runtime(
            group=group,
            check_every_call=config.debug,
            contiguous_key=next(_arena_keys) if config.contiguous else -1,
            profile_id=profile.id if profile is not None else -1,
            sync=config.synchronize,
        )
        inner = planned.is_baseline and runtime.plain and not planned.resolved.moves and planned.inner_modules
        if inner:
            fw, bw = inner  # the inner compiler's own partition, exactly as plain torch.compile runs it
        else:
            fw, bw = split(
                joint, planned.problem, planned.resolved, num_fwd_outputs, static_lifetime_input_indices, runtime
            )
        _graphs.append((fw, bw))
        del _graphs[:-8]
        return fw, bw

    def plan(self, joint: fx.GraphModule, num_fwd_outputs: int, static: Sequence[int] | None) -> Planned:
        """Plan the joint graph; under a byte budget, as one graph of its step (remat/step.py): the budget less
        what the step's earlier graphs keep for backward."""
        config, step = self.config, self.step
        frame = _torch.current_compile_frame() if step is not None and config.budget_kind() == "bytes" else None
        if frame is None or step is None:
            return plan_joint(joint, num_fwd_outputs, config, self.hooked, static)
        if self.slot is None:  # a graph partitioned again keeps its place
            self.slot = step.slot(frame, input_shapes(joint))
        return plan_in_step(step, self.slot, joint, num_fwd_outputs, config, self.hooked, static, self.followed)


_HookBase = _torch.custom_partitioner_base() or object


class InductorPartitioner(_HookBase):  # type: ignore[misc, valid-type]
    """remat's partitioner in inductor's custom-partitioner hook (inductor runs its joint-graph passes first)."""

    def __init__(
        self,
        config: RematConfig,
        hooked: frozenset[str] = frozenset(),
        step: StepLedger | None = None,
        followed: bool = False,
    ):
        self.partitioner = Partitioner(config, hooked, step, followed)

    def __call__(self, gm, joint_inputs, **kwargs):
        if "partitioner" not in self.__dict__:
            raise RuntimeError(
                "remat's inductor partitioner was copied out of inductor's config (pickle or deepcopy): a copy keys "
                'inductor\'s caches only and cannot partition; compile with backend="remat" instead of setting '
                "custom_partitioner_fn from a saved config"
            )
        kwargs.pop("compiler", None)
        return self.partitioner(gm, joint_inputs, **kwargs)

    def uuid(self):
        # The compile cache must not reuse a graph partitioned under another config, nor, under a byte budget for
        # the step, one planned in another step or another state of it (a reused graph would not be counted).
        if "partitioner" not in self.__dict__:
            return self.__dict__["key"]  # a copy for inductor's cache key (__setstate__)
        step = self.partitioner.step
        split = f":{step.key()}" if step is not None and self.partitioner.config.budget_kind() == "bytes" else ""
        return f"remat {code_version()}:{self.partitioner.config!r}:{sorted(self.partitioner.hooked)}{split}"

    def __getstate__(self):
        # Only inductor's cache key pickles the hook; a policy callable may not pickle, its uuid does.
        return {"key": self.uuid()}

    def __setstate__(self, state):
        # inductor copies its config (the hook in it) to key its caches: the copy keys, it never partitions.
        self.__dict__["key"] = state["key"]


def compile_graph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    config: RematConfig,
    force_fallback: bool = False,
    step: StepLedger | None = None,
):
    """Compile one dynamo graph with remat's partitioner and the configured inner compiler. `step`: the ledger of
    the graphs this backend compiled before (remat/step.py), so a byte budget bounds the step; None: planned alone."""
    hooked = hooked_nodes(gm)
    followed = step is not None and _torch.ends_at_graph_break(gm)
    if config.inner == "inductor":
        if _HookBase is not object and not force_fallback:
            hook = InductorPartitioner(config, hooked, step, followed)
            return _torch.compile_fx(
                gm, example_inputs, config_patches={"custom_partitioner_fn": hook}, inner_compile=_inner_compile
            )
        inner_compile = _inner_compile
        return _torch.aot_autograd(
            fw_compiler=inner_compile,
            bw_compiler=inner_compile,
            partition_fn=Partitioner(config, hooked, step, followed),
            decompositions=_torch.inductor_decompositions(),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)
    # "eager" runs the planned modules op by op through fx.Interpreter (slowest, easiest to debug).
    inner = _torch.boxed_nop() if config.inner == "aot_eager" else _torch.boxed_interpreter
    return _torch.aot_autograd(
        fw_compiler=inner,
        bw_compiler=inner,
        partition_fn=Partitioner(config, hooked, step, followed),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _inner_compile(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
    """inductor's compiler of one module remat built, its recomputation blocks kept apart (_torch.fusion_barrier)
    and the device memory its host copies read never reused by inductor while the copies run (_async_reads)."""
    with _torch.fusion_barrier(gm), _async_reads(gm):
        return _torch.compile_fx_inner()(gm, example_inputs, **kwargs)


def _async_reads(gm: fx.GraphModule) -> contextlib.AbstractContextManager:
    """On CUDA, offload's copy to the host runs on a side stream and reads its input after the op returned; inductor
    must not hand that memory to a later kernel of the module meanwhile. A null context for modules with no such
    copy (on CPU the copy is done when the op returns)."""
    offload = table.OFFLOAD.overload
    for node in gm.graph.nodes:
        if node.target is offload and _on_cuda(node.args[0]):
            return _torch.inputs_never_reused([offload])
    return contextlib.nullcontext()


def _on_cuda(arg: Any) -> bool:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == "cuda"


def remat_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None, **kwargs: Any
):
    """Entry point registered as torch_dynamo_backends:remat. Without `options`, the REMAT_OPTIONS environment
    variable (a JSON object of options) is read, when set."""
    if kwargs.get("mode") is not None:
        raise ValueError(f"mode={kwargs['mode']!r}: the remat backend takes no mode; pass options={{...}} instead")
    if options is None:
        config = config_from_environment()  # callers that can name the backend but pass no options
    else:
        config = options if isinstance(options, RematConfig) else RematConfig.from_options(options)
    return compile_graph(gm, example_inputs, config, step=_ledger_of(options))


# torch.compile hands the backend the same options object on every compile of one torch.compile call: the graphs
# compiled with one options object (or, without options, with REMAT_OPTIONS) are one step's. The options are held
# so that their id stays theirs; the oldest ledgers are dropped past 64.
_ledgers: dict[int | None, tuple[object, StepLedger]] = {}


def _ledger_of(options: object) -> StepLedger:
    key = None if options is None else id(options)
    if key not in _ledgers:
        _ledgers[key] = (options, StepLedger())
        for old in list(_ledgers)[:-64]:
            del _ledgers[old]
    return _ledgers[key][1]


def compile(model: Any, *, dynamic: bool | None = None, fullgraph: bool = False, **fields: Any):
    """`torch.compile(model, backend="remat", options=fields)` with the fields checked up front."""
    config = RematConfig.from_options(fields)  # an unknown field is named with the closest valid one
    shard_group(config)  # fail now, not at the first call, when partition= has no process group
    return torch.compile(model, backend=_Backend(config), dynamic=dynamic, fullgraph=fullgraph)


class _Backend:
    """The backend of one remat.compile call: the graphs it compiles are one step's (remat/step.py)."""

    def __init__(self, config: RematConfig):
        self.config = config
        self.step = StepLedger()

    def __call__(self, gm, example_inputs):
        return compile_graph(gm, example_inputs, self.config, step=self.step)
