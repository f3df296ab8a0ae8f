"""Plan without training: `remat.explain(model, *inputs, **fields) -> Plan`."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch
import torch.fx as fx

from .config import RematConfig
from .pipeline import Planned, plan_joint


@dataclasses.dataclass(frozen=True)
class Captured:
    joint: fx.GraphModule
    num_fwd_outputs: int
    hooked: frozenset[str] = frozenset()  # dynamo-graph nodes with tensor hooks (capture.hooked_nodes)


def capture_joints(model: Callable[..., Any], *inputs: Any, dynamic: bool | None = None) -> list[Captured]:
    """Trace `model(*inputs)` with dynamo + aot_autograd and return each joint graph, without running a backward
    pass. The model is deep-copied and the RNG state restored, so nothing the caller sees changes. `dynamic` is
    torch.compile's."""
    from torch._dynamo.backends.common import aot_autograd

    from ._torch import boxed_nop

    from .capture import hooked_nodes

    joints: list[Captured] = []
    hooked: list[frozenset[str]] = []

    def keep(joint, _inputs, *, num_fwd_outputs, **_kw):
        joints.append(Captured(joint, num_fwd_outputs, hooked[-1]))
        from torch._functorch.partitioners import default_partition

        return default_partition(joint, _inputs, num_fwd_outputs=num_fwd_outputs)

    # The same aot_autograd settings as the backend, so explain plans the graph a compile would plan.
    aot = aot_autograd(fw_compiler=boxed_nop(), bw_compiler=boxed_nop(), partition_fn=keep,
                       keep_inference_input_mutations=True)

    def backend(gm, example_inputs):
        hooked.append(hooked_nodes(gm))
        return aot(gm, example_inputs)

    target = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    with torch.random.fork_rng(devices=[]):
        torch._dynamo.reset()
        try:
            torch.compile(target, backend=backend, dynamic=dynamic)(*inputs)
        finally:
            torch._dynamo.reset()
    if not joints:
        raise ValueError(
            "remat.explain: no training graph was captured; the model must return tensors that require grad "
            "(call it outside torch.no_grad(), with parameters or inputs that require grad)"
        )
    return joints


def explain_all(model: Callable[..., Any], *inputs: Any, **fields: Any) -> list[Planned]:
    config = RematConfig.from_options(fields)
    return [plan_joint(c.joint, c.num_fwd_outputs, config, c.hooked) for c in capture_joints(model, *inputs)]


def explain(model: Callable[..., Any], *inputs: Any, **fields: Any):
    """Plan `model(*inputs)` under the RematConfig `fields` without running a training step; returns the Plan
    (of the last graph, when the model compiles to several — see `explain_all`)."""
    return explain_all(model, *inputs, **fields)[-1].plan
