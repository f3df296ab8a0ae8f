"""torch's forward/backward partitioners: the module builder remat splits a joint graph with, and the default and
min-cut partitioners remat compares against."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import threading
from typing import Any, Callable, Iterator

from .graph import tree_leaves
from .guard import SUPPORTED, TorchAPIError, lookup


_BUILDER = "_extract_fwd_bwd_modules"  # torch's forward/backward module builder, in torch._functorch.partitioners


def extract_fwd_bwd_modules() -> Callable[..., Any]:
    return lookup("torch._functorch.partitioners", _BUILDER)


def split_joint(
    joint: Any,
    saved_values: list,
    saved_syms: list,
    saved_opaque: list,
    *,
    num_fwd_outputs: int,
    static_lifetime_inputs: list | None = None,
) -> tuple[Any, Any]:
    """torch's `_extract_fwd_bwd_modules`: the forward and backward modules of `joint` given what forward hands to
    backward: tensors, symbolic sizes and opaque objects (process groups, device meshes, script objects: tensor
    parallelism's DTensors carry their mesh as one). Raises TorchAPIError naming the torch version when `joint`
    has opaque objects to hand over and this torch's function cannot take them."""
    import inspect

    import torch

    extract = extract_fwd_bwd_modules()
    parameters = inspect.signature(extract).parameters
    kwargs: dict[str, Any] = {"num_fwd_outputs": num_fwd_outputs}
    if static_lifetime_inputs and "static_lifetime_input_nodes" in parameters:
        ordered_set = lookup("torch.utils._ordered_set", "OrderedSet")
        kwargs["static_lifetime_input_nodes"] = ordered_set(static_lifetime_inputs)
    if saved_opaque:
        if "saved_opaque_nodes" not in parameters:
            names = ", ".join(n.name for n in saved_opaque[:4])
            raise TorchAPIError(
                f"this graph hands opaque objects to backward ({names}: process groups or device meshes, as tensor "
                f"parallelism's DTensors carry them), and torch {torch.__version__}'s "
                "torch._functorch.partitioners._extract_fwd_bwd_modules has no saved_opaque_nodes parameter to "
                "pass them; use a torch whose partitioner takes them (2.13 does), or compile this model with a "
                f'plain backend ("aot_eager", "inductor"); {SUPPORTED}'
            )
        kwargs["saved_opaque_nodes"] = list(saved_opaque)
    return extract(joint, saved_values, saved_syms, **kwargs)


def default_partition(joint: Any, joint_inputs: Any, *, num_fwd_outputs: int) -> tuple[Any, Any]:
    """torch's default partitioner (saves what the backward reads, recomputes nothing): (forward, backward)."""
    partition = lookup("torch._functorch.partitioners", "default_partition")
    return partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)


def min_cut_partition(
    joint: Any, num_fwd_outputs: int, static_lifetime_input_indices: Any = None, *, merged: bool = False
) -> tuple[Any, Any, tuple[str, ...]]:
    """torch's min-cut partitioner, as plain `torch.compile` with inductor runs it, on a copy of `joint` (it rewrites
    the graph it is given): (forward module, backward module, names of the saved nodes, symbolic sizes included).
    `merged`: `joint` has been through `min_cut_cse` already, so the partitioner's own pass of it (which would find
    nothing left to merge) is skipped."""
    fw, bw = _min_cut(joint, num_fwd_outputs, static_lifetime_input_indices, merged)
    return fw, bw, _saved_names(fw, num_fwd_outputs)


def _saved_names(fw: Any, num_fwd_outputs: int) -> tuple[str, ...]:
    """The names of the nodes forward module `fw` hands to backward: its outputs after the forward's own."""
    import torch.fx as fx

    outputs = fw.graph.find_nodes(op="output")[0].args[0]
    return tuple(o.name for o in outputs[num_fwd_outputs:] if isinstance(o, fx.Node))


class _Chosen(Exception):
    """Raised inside torch's min-cut partitioner once it has chosen what to save (min_cut_saved)."""

    def __init__(self, saved: tuple[str, ...]):
        super().__init__(saved)
        self.saved = saved


_stopping = threading.local()  # per thread: min_cut_saved is waiting for the saved set
_patching = threading.Lock()


def min_cut_saved(
    joint: Any, num_fwd_outputs: int, static_lifetime_input_indices: Any = None, *, merged: bool = False
) -> tuple[str, ...]:
    """The names of the values torch's min-cut partitioner saves for `joint`, without the forward and backward
    modules: the partitioner stops where it hands its saved set to the module builder (`_extract_fwd_bwd_modules`),
    which on large graphs is half its time. The set is the one it chose, before the builder drops saved values the
    backward graph does not read; a plan resolved from it (Problem.resolve_saved walks from what backward reads) is
    the plan of min_cut_partition's set. Where the builder would also add saved values — the bindings of symbolic
    sizes, in a graph with dynamic shapes — or where this torch's partitioner never calls the builder, the whole
    partition runs and its saved set is returned."""
    partitioners = importlib.import_module("torch._functorch.partitioners")
    build = lookup(partitioners.__name__, _BUILDER)  # what torch's partitioner calls, restored as it was found

    def stop(joint_module, saved_values, saved_sym_nodes, *args, **kwargs):
        if not getattr(_stopping, "on", False) or saved_sym_nodes or _has_symbolic_inputs(joint_module):
            return build(joint_module, saved_values, saved_sym_nodes, *args, **kwargs)
        opaque = kwargs.get("saved_opaque_nodes") or ()
        raise _Chosen(tuple(n.name for n in (*saved_values, *opaque)))

    with _patching:
        setattr(partitioners, _BUILDER, stop)
        _stopping.on = True
        try:
            modules = _min_cut(joint, num_fwd_outputs, static_lifetime_input_indices, merged)
        except _Chosen as chosen:
            return chosen.saved
        finally:
            _stopping.on = False
            setattr(partitioners, _BUILDER, build)
    return _saved_names(modules[0], num_fwd_outputs)


def _has_symbolic_inputs(joint: Any) -> bool:
    """Whether a placeholder of `joint` is a symbolic size or a tensor of symbolic shape (dynamic shapes)."""
    import torch

    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
    for node in joint.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, symbolic):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
    return False


def _min_cut(joint: Any, num_fwd_outputs: int, static_lifetime_input_indices: Any, merged: bool):
    """torch's min_cut_rematerialization_partition on a copy of `joint` (node metadata shared, fake tensors not
    copied) under the same root module: its (forward, backward) modules."""
    import copy

    min_cut = lookup("torch._functorch.partitioners", "min_cut_rematerialization_partition")
    config = importlib.import_module("torch._functorch.config")
    with lazy_graph_modules() as make_module:
        copied = make_module(joint, copy.deepcopy(joint.graph))
        with config.patch(cse=False) if merged and getattr(config, "cse", False) else contextlib.nullcontext():
            return min_cut(
                copied,
                None,
                compiler="inductor",
                num_fwd_outputs=num_fwd_outputs,
                static_lifetime_input_indices=static_lifetime_input_indices,
            )


@contextlib.contextmanager
def lazy_graph_modules() -> Iterator[Callable[..., Any]]:
    """A context in which the graph modules torch builds generate their Python code when first run or read, not
    when built — as inside a `torch.compile`, whose dynamo frame turns this on for the backend it calls — and the
    builder of such a module, `(root, graph) -> GraphModule`. On a torch without the switch, plain GraphModules (the
    same modules, their code generated at once)."""
    import torch.fx as fx

    try:
        use_lazy = lookup("torch.fx._lazy_graph_module", "_use_lazy_graph_module")
        make = lookup("torch.fx._lazy_graph_module", "_make_graph_module")
    except TorchAPIError:
        yield fx.GraphModule
        return
    with use_lazy(True):
        yield make


def min_cut_cse(joint: Any, num_fwd_outputs: int) -> None:
    """Merge repeated computations of `joint` in place, as torch's min-cut partitioner does before it partitions
    (when torch._functorch.config.cse is on): a backward op that repeats a forward op then reads the forward value,
    so remat plans the same graph plain `torch.compile` with inductor partitions. Where this torch's fx_graph_cse
    takes an extra key per node (2.14), its partitioner keeps a value the gradients depend on apart from an equal
    one they do not (merged, the partitioner may save the value as an extra forward output); so does this."""
    if not getattr(importlib.import_module("torch._functorch.config"), "cse", False):
        return
    joint.graph.eliminate_dead_code()
    cse = lookup("torch._functorch.compile_utils", "fx_graph_cse")
    if "extra_node_key" in inspect.signature(cse).parameters:
        graph = cse(joint.graph, extra_node_key=_gradient_ancestors(joint, num_fwd_outputs).__contains__)
    else:
        graph = cse(joint.graph)
    joint.graph = graph  # the setter recompiles


def _gradient_ancestors(joint: Any, num_fwd_outputs: int) -> set[Any]:
    """The nodes the joint graph's gradient outputs (those after its forward outputs) are computed from, themselves
    included."""
    (output,) = joint.graph.find_nodes(op="output")
    outputs = tree_leaves(output.args)
    stack = [node for node in outputs[num_fwd_outputs:] if node is not None]
    found: set[Any] = set()
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(node.all_input_nodes)
    return found


def activation_memory_budget(budget: float) -> Any:
    """A context in which torch's own partitioner works to `activation_memory_budget=budget` (a fraction of the
    saved bytes), restored when it ends."""
    return importlib.import_module("torch._functorch.config").patch(activation_memory_budget=budget)
