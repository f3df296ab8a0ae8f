"""What remat reads from torch's fx graphs: op classes and schemas, pytrees, the node metadata torch's tracers and
partitioners write for themselves, symbolic sizes and opaque values."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

from .guard import TorchAPIError, lookup

# Op classes: an aten (or library) overload such as aten.mm.default, its packet aten.mm, and higher-order ops.
if TYPE_CHECKING:
    from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
else:
    OpOverload = lookup("torch._ops", "OpOverload")
    OpOverloadPacket = lookup("torch._ops", "OpOverloadPacket")
    HigherOrderOperator = lookup("torch._ops", "HigherOrderOperator")

# torch's pytree: nested tuples, lists and dicts flattened to their leaves and back.
tree_leaves: Callable[..., list] = lookup("torch.utils._pytree", "tree_leaves")
tree_map: Callable[..., Any] = lookup("torch.utils._pytree", "tree_map")
tree_flatten: Callable[..., tuple] = lookup("torch.utils._pytree", "tree_flatten")
tree_unflatten: Callable[..., Any] = lookup("torch.utils._pytree", "tree_unflatten")


def op_schema(op: Any) -> Any:
    """The schema (torch.FunctionSchema) of an OpOverload: its name, arguments, returns and their alias info."""
    return op._schema


def overload_name(op: Any) -> str:
    """The overload of an OpOverload ("default", "Tensor"), as torch names it in "aten::add.Tensor"."""
    return str(op._overloadname)


def is_mutable_op(target: Any) -> bool:
    """Whether `target` is an OpOverload that writes one of its inputs in place."""
    return isinstance(target, OpOverload) and bool(target._schema.is_mutable)


# Node metadata torch writes for itself (not part of fx's documented "val"/"nn_module_stack"/"stack_trace").


def origin_name(node: Any) -> str:
    """The name of the node this node was made from by a graph pass (fx's provenance record), or ""."""
    sources = node.meta.get("from_node") or ()
    return str(getattr(sources[0], "name", "")) if sources else ""


def partitioner_tag(node: Any) -> str | None:
    """aot_autograd's note on where the node must run: "is_backward" (traced in the backward pass),
    "must_be_in_backward", or None."""
    return node.meta.get("partitioner_tag")


def module_stack(node: Any) -> dict:
    """The nn.Module stack the node was traced under; for a backward node, the stack of the forward node it
    differentiates (aot_autograd's "fwd_nn_module_stack") when it has none of its own."""
    return node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}


def checkpoint_mark(node: Any) -> tuple[Any, Any] | None:
    """(CheckpointPolicy, region id) torch.utils.checkpoint recorded on a node traced inside a checkpointed region,
    or None; torch's partitioners also tag inputs MUST_SAVE without a region: those give None too."""
    policy = node.meta.get("recompute")
    region = node.meta.get("ac_graph_id")
    return None if policy is None or region is None else (policy, region)


def input_descriptor(node: Any) -> Any:
    """The descriptor aot_autograd records for a joint-graph input, or None."""
    return node.meta.get("desc")


def mutated_input_descriptors(output: Any) -> list:
    """The descriptors of the inputs aot_autograd functionalized into extra forward outputs (its runtime copies them
    back), read from the output node's descriptors; [] where this torch records none."""
    descs = output.meta.get("desc") or ()
    return [getattr(d, "mutated_input", None) for d in descs if type(d).__name__ == "InputMutationAOTOutput"]


def subclass_component(node: Any) -> str:
    """For a joint-graph input aot_autograd unwrapped from a tensor-subclass input (a DTensor parameter under tensor
    parallelism), the attribute of the subclass it holds ("_local_tensor", "device_mesh"), read from the input
    descriptor aot_autograd records; "" for a plain input, or where this torch records no descriptors."""
    desc = node.meta.get("desc")
    if type(desc).__name__ != "SubclassGetAttrAOTInput":
        return ""
    return str(getattr(desc, "attr", ""))


# Symbolic sizes.


def sym_node_expr(x: Any) -> Any:
    """The sympy expression behind a SymInt."""
    return x.node.expr


def sym_node_hint(x: Any) -> int:
    """A SymInt's value at its size hint (from the shape environment when the SymInt carries none)."""
    hint = x.node.hint
    if hint is None:
        hint = x.node.shape_env.size_hint(x.node.expr)
    return int(hint)


def is_sym_node() -> Callable[..., bool]:
    return lookup("torch.fx.experimental.proxy_tensor", "is_sym_node")


def is_opaque(value: Any) -> bool:
    """True for a node value that is an opaque object (a process group, a device mesh, a script object, real or
    fake) rather than a tensor or a size: forward hands it to backward as it is; it has no bytes to plan."""
    import torch

    kinds: tuple[type, ...] = (torch.ScriptObject,)
    try:
        kinds += (lookup("torch._library.fake_class_registry", "FakeScriptObject"),)
    except TorchAPIError:
        pass
    if isinstance(value, kinds):
        return True
    check = _opaque_check()
    return check is not None and bool(check(value))


def _opaque_check() -> Callable[[Any], bool] | None:
    """torch's check for a value of a registered opaque type: is_custom_class_obj from torch 2.14 (its
    is_opaque_value logs a deprecation warning on every call), is_opaque_value before; None on a torch without
    registered opaque types (it has only script objects)."""
    try:
        module = importlib.import_module("torch._library.opaque_object")
    except ImportError:
        return None
    return getattr(module, "is_custom_class_obj", None) or getattr(module, "is_opaque_value", None)
