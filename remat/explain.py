"""Plan without training: `remat.explain(model, *inputs, **fields) -> Plan`."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch
import torch.fx as fx

from . import _torch, scoped
from .config import RematConfig
from .pipeline import Planned, plan_joint
from .step import StepLedger, plan_in_step


@dataclasses.dataclass(frozen=True)
class Captured:
    joint: fx.GraphModule
    num_fwd_outputs: int
    hooked: frozenset[str] = frozenset()  # dynamo-graph nodes with tensor hooks (capture.hooked_nodes)
    static_lifetime_input_indices: tuple[int, ...] | None = None  # as aot_autograd passes them to partitioners
    followed: bool = False  # dynamo cut the graph short: more graphs of the step follow it (remat/step.py)


def capture_joints(
    model: Callable[..., Any], *inputs: Any, dynamic: bool | None = None, inner: str = "aot_eager"
) -> list[Captured]:
    """Trace `model(*inputs)` with dynamo + aot_autograd and return each joint graph, without running a backward
    pass. The model is deep-copied, the RNG state restored and the compile forgotten afterwards (`remat.scoped`), so
    nothing the caller sees changes: functions it compiled before neither recompile nor lose their code. `dynamic` is
    torch.compile's; with `inner="inductor"` the joint graph is the one a compile with inductor plans (inductor's
    decompositions and joint-graph passes applied), though no code is generated."""
    from .capture import hooked_nodes

    joints: list[Captured] = []
    hooked: list[frozenset[str]] = []
    followed: list[bool] = []

    def keep(joint, joint_inputs, *, num_fwd_outputs, static_lifetime_input_indices=None, **_kw):
        static = tuple(static_lifetime_input_indices) if static_lifetime_input_indices is not None else None
        # a copy of the graph: the partition below may rewrite the one it is given
        joints.append(
            Captured(
                fx.GraphModule(joint, copy.deepcopy(joint.graph)), num_fwd_outputs, hooked[-1], static, followed[-1]
            )
        )
        return _torch.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    compile_graph = _inductor_capture(keep) if inner == "inductor" else _aot_capture(keep)

    def backend(gm, example_inputs):
        hooked.append(hooked_nodes(gm))
        followed.append(_torch.ends_at_graph_break(gm))
        return compile_graph(gm, example_inputs)

    target = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    # Through a code object of its own and forgotten afterwards: functions the caller compiled keep their code.
    with torch.random.fork_rng(devices=[]), scoped.session():
        torch.compile(scoped.own_code(target), backend=backend, dynamic=dynamic)(*inputs)
    if not joints:
        raise ValueError(
            "remat.explain: no training graph was captured; the model must return tensors that require grad "
            "(call it outside torch.no_grad(), with parameters or inputs that require grad)"
        )
    return joints


def explain_all(model: Callable[..., Any], *inputs: Any, **fields: Any) -> list[Planned]:
    """Plan every graph `model(*inputs)` compiles to, in order; a byte budget bounds the step they make up, as in
    a compile (remat/step.py: each Plan's `step_share` tells the split)."""
    config = RematConfig.from_options(fields)
    captured = capture_joints(model, *inputs, inner=config.inner)
    if config.budget_kind() != "bytes":
        return [
            plan_joint(c.joint, c.num_fwd_outputs, config, c.hooked, c.static_lifetime_input_indices) for c in captured
        ]
    step = StepLedger()
    # the captured graphs in step order, as one compile's graphs (each slot taken once the one before is recorded)
    return [
        plan_in_step(
            step,
            step.slot((0, 0)),
            c.joint,
            c.num_fwd_outputs,
            config,
            c.hooked,
            c.static_lifetime_input_indices,
            c.followed,
        )
        for c in captured
    ]


def explain(model: Callable[..., Any], *inputs: Any, **fields: Any):
    """Plan `model(*inputs)` under the RematConfig `fields` without running a training step; returns the Plan
    (of the last graph, when the model compiles to several — see `explain_all`)."""
    return explain_all(model, *inputs, **fields)[-1].plan


def _aot_capture(keep: Callable[..., Any], decompositions=None) -> Callable[..., Any]:
    """aot_autograd with the backend's settings, `keep` as the partition function and no code generation."""
    return _torch.aot_autograd(
        fw_compiler=_torch.boxed_nop(),
        bw_compiler=_torch.boxed_nop(),
        partition_fn=keep,
        decompositions=decompositions,
        keep_inference_input_mutations=True,
    )


def _inductor_capture(keep: Callable[..., Any]) -> Callable[..., Any]:
    """The path a compile with inner="inductor" takes up to the partitioner (inductor's decompositions, then its
    joint-graph passes through the custom-partitioner hook), with the generated code replaced by the FX modules."""
    if _HookBase is object:  # the backend's own fallback: aot_autograd with inductor's decompositions
        return _aot_capture(keep, _torch.inductor_decompositions())

    def no_codegen(gm, example_inputs, **_kw):
        return _torch.boxed_nop()(gm, example_inputs)

    def compile_graph(gm, example_inputs):
        return _torch.compile_fx(
            gm, example_inputs, inner_compile=no_codegen, config_patches={"custom_partitioner_fn": _Recorder(keep)}
        )

    return compile_graph


_HookBase = _torch.custom_partitioner_base() or object


class _Recorder(_HookBase):  # type: ignore[misc, valid-type]
    """inductor's custom-partitioner hook that hands the joint graph to `keep`."""

    def __init__(self, keep: Callable[..., Any]):
        self.keep = keep

    def __call__(self, gm, joint_inputs, **kwargs):
        kwargs.pop("compiler", None)
        return self.keep(gm, joint_inputs, **kwargs)

    def uuid(self):
        return f"remat-explain:{id(self)}"  # never shared: every capture partitions anew

    def __getstate__(self):
        return {"uuid": self.uuid()}  # only inductor's cache key pickles the hook
