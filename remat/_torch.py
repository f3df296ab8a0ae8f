"""Every private torch API remat uses, looked up in one place and guarded.

torch 2.11–2.14 are supported. Each helper checks that the API exists and fails with a message that names the torch
version and the missing piece instead of an AttributeError from deep inside a compile.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator


# The torch versions remat supports, oldest and newest: pyproject's requirement and the README's test matrix agree.
SUPPORTED_TORCH = ("2.11", "2.14")
_SUPPORTED = f"remat supports torch {SUPPORTED_TORCH[0]} to {SUPPORTED_TORCH[1]}"


class TorchAPIError(RuntimeError):
    """A private torch API remat relies on is missing or changed in this torch version."""


def _lookup(module: str, name: str) -> Any:
    import torch

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise TorchAPIError(
            f"remat needs {module}.{name}, which torch {torch.__version__} does not provide; {_SUPPORTED}"
        ) from exc


def extract_fwd_bwd_modules() -> Callable[..., Any]:
    return _lookup("torch._functorch.partitioners", "_extract_fwd_bwd_modules")


def split_joint(joint: Any, saved_values: list, saved_syms: list, saved_opaque: list, *, num_fwd_outputs: int,
                static_lifetime_inputs: list | None = None) -> tuple[Any, Any]:
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
        from torch.utils._ordered_set import OrderedSet

        kwargs["static_lifetime_input_nodes"] = OrderedSet(static_lifetime_inputs)
    if saved_opaque:
        if "saved_opaque_nodes" not in parameters:
            names = ", ".join(n.name for n in saved_opaque[:4])
            raise TorchAPIError(
                f"this graph hands opaque objects to backward ({names}: process groups or device meshes, as tensor "
                f"parallelism's DTensors carry them), and torch {torch.__version__}'s "
                "torch._functorch.partitioners._extract_fwd_bwd_modules has no saved_opaque_nodes parameter to "
                "pass them; use a torch whose partitioner takes them (2.13 does), or compile this model with a "
                f"plain backend (\"aot_eager\", \"inductor\"); {_SUPPORTED}")
        kwargs["saved_opaque_nodes"] = list(saved_opaque)
    return extract(joint, saved_values, saved_syms, **kwargs)


def subclass_component(node: Any) -> str:
    """For a joint-graph input aot_autograd unwrapped from a tensor-subclass input (a DTensor parameter under tensor
    parallelism), the attribute of the subclass it holds ("_local_tensor", "device_mesh"), read from the input
    descriptor aot_autograd records; "" for a plain input, or where this torch records no descriptors."""
    desc = node.meta.get("desc")
    if type(desc).__name__ != "SubclassGetAttrAOTInput":
        return ""
    return str(getattr(desc, "attr", ""))


def is_opaque(value: Any) -> bool:
    """True for a node value that is an opaque object (a process group, a device mesh, a script object, real or
    fake) rather than a tensor or a size: forward hands it to backward as it is; it has no bytes to plan."""
    import torch

    kinds: tuple[type, ...] = (torch.ScriptObject,)
    try:
        kinds += (_lookup("torch._library.fake_class_registry", "FakeScriptObject"),)
    except TorchAPIError:
        pass
    if isinstance(value, kinds):
        return True
    try:
        is_opaque_value = _lookup("torch._library.opaque_object", "is_opaque_value")
    except TorchAPIError:
        return False  # a torch without registered opaque types has only script objects
    return bool(is_opaque_value(value))


def is_sym_node() -> Callable[..., bool]:
    return _lookup("torch.fx.experimental.proxy_tensor", "is_sym_node")


def custom_partitioner_base() -> type | None:
    """inductor's CustomPartitionerFn base class, or None when this torch has no custom-partitioner hook."""
    try:
        base = _lookup("torch._inductor.custom_graph_pass", "CustomPartitionerFn")
        config = importlib.import_module("torch._inductor.config")
    except (TorchAPIError, ImportError):
        return None
    return base if hasattr(config, "custom_partitioner_fn") else None


def boxed_nop() -> Callable[..., Any]:
    """torch's aot_eager inner compiler: runs the module as generated Python with the boxed calling convention, so
    each input is released after its last use. Falls back to fx.Interpreter.boxed_run, which frees the same way."""
    try:
        return _lookup("torch._dynamo.backends.debugging", "boxed_nop")
    except TorchAPIError:
        return boxed_interpreter


def boxed_interpreter(gm: Any, _inputs: Any) -> Callable[..., Any]:
    import torch.fx as fx

    def run(args: list) -> Any:
        return fx.Interpreter(gm).boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def storage_use_count(tensor: Any) -> int:
    """How many tensors (views included) share `tensor`'s storage."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        raise TorchAPIError(f"remat needs torch._C._storage_Use_Count, which torch {torch.__version__} does not "
                            f"provide; {_SUPPORTED}")
    storage = tensor.untyped_storage()
    return count(storage._cdata) - 1  # minus the reference `storage` itself holds


def rng_replay_ops() -> tuple[Any, Any]:
    """torch's higher-order ops that run a random op recording the generator state before it, and re-run it from
    a recorded state (leaving the generator as it was): (run_and_save_rng_state, run_with_rng_state)."""
    return (_lookup("torch._prims.rng_prims", "run_and_save_rng_state"),
            _lookup("torch._prims.rng_prims", "run_with_rng_state"))


def outside_fake_mode() -> Any:
    """A context in which tensors are real again while a compile runs under fake tensors (for collectives at
    compile time)."""
    return _lookup("torch._subclasses.fake_tensor", "unset_fake_temporarily")()


def min_cut_partition(joint: Any, num_fwd_outputs: int,
                      static_lifetime_input_indices: Any = None) -> tuple[Any, Any, tuple[str, ...]]:
    """torch's min-cut partitioner, as plain `torch.compile` with inductor runs it, on a copy of `joint` (it rewrites
    the graph it is given): (forward module, backward module, names of the saved nodes, symbolic sizes included)."""
    import copy

    import torch.fx as fx

    min_cut = _lookup("torch._functorch.partitioners", "min_cut_rematerialization_partition")
    # A copy of the graph (node metadata shared, fake tensors not copied) under the same root module.
    copied = fx.GraphModule(joint, copy.deepcopy(joint.graph))
    fw, bw = min_cut(copied, None, compiler="inductor", num_fwd_outputs=num_fwd_outputs,
                     static_lifetime_input_indices=static_lifetime_input_indices)
    outputs = fw.graph.find_nodes(op="output")[0].args[0]
    saved = tuple(o.name for o in outputs[num_fwd_outputs:] if isinstance(o, fx.Node))
    return fw, bw, saved


def min_cut_cse(joint: Any) -> None:
    """Merge repeated computations of `joint` in place, as torch's min-cut partitioner does before it partitions
    (when torch._functorch.config.cse is on): a backward op that repeats a forward op then reads the forward value,
    so remat plans the same graph plain `torch.compile` with inductor partitions."""
    if not getattr(importlib.import_module("torch._functorch.config"), "cse", False):
        return
    joint.graph.eliminate_dead_code()
    joint.graph = _lookup("torch._functorch.compile_utils", "fx_graph_cse")(joint.graph)
    joint.recompile()


def wrap_policy_targets(policy: Any, root: Any) -> dict | None:
    """The submodules of `root` a torch wrap-policy object (`ModuleWrapPolicy`, `CustomPolicy`: subclasses of
    torch.distributed.fsdp.wrap._Policy) selects, each with the keyword arguments for its wrapper; None when `policy`
    is not such an object."""
    try:
        base = _lookup("torch.distributed.fsdp.wrap", "_Policy")
    except TorchAPIError:
        return None  # torch without torch.distributed: no policy object can exist
    if not isinstance(policy, base):
        return None
    return policy._run_policy(root, ignored_modules=set(), root_kwargs={})


@contextlib.contextmanager
def forget_compiles() -> Iterator[None]:
    """Forget, when the block ends, what dynamo compiled inside it, leaving what it compiled before as it was: each
    cache entry the block added to a code object is invalidated as torch invalidates an entry whose guarded object
    died (its compiled code and backend are released; it never matches again), and the backends the block used are
    dropped from dynamo's backend cache, so nothing the block compiled stays alive. Entries made before the block
    stay valid: functions compiled earlier neither lose their code nor recompile. Where this torch lacks the pieces,
    the block's compiles are simply left in the caches."""
    try:
        entries_of = _lookup("torch._dynamo.eval_frame", "_debug_get_cache_entry_list")
        deleted = _lookup("torch._dynamo.guards", "DeletedGuardManagerWrapper")
        seen = _lookup("torch._dynamo.convert_frame", "input_codes").seen
        backends = _lookup("torch._dynamo.eval_frame", "cached_backends")
    except TorchAPIError:
        yield
        return

    def live_entries() -> list:
        codes = [code for code in (ref() for ref in list(seen)) if code is not None]
        return [entry for code in codes for entry in entries_of(code) if entry.code is not None]

    # The compiled code objects of the entries made before, held so that their ids stay theirs during the block.
    held = [entry.code for entry in live_entries()]
    before = {id(code) for code in held}
    known_backends = set(backends)
    try:
        yield
    finally:
        for entry in live_entries():
            if id(entry.code) in before:
                continue
            manager = entry.guard_manager
            state = getattr(manager, "extra_state", None)
            if state is None:
                continue
            state.invalidate(entry, deleted("compiled by remat for its own use and forgotten after it"))
            manager.cache_entry = None  # torch's own invalidation (a guarded object dying) then finds nothing to do
        for key in set(backends) - known_backends:
            del backends[key]
        del held


def current_compile_id() -> str:
    """The id of the compile in progress as torch's logs and tlparse print it ("0/0"), or "" outside a compile or
    where this torch lacks it."""
    try:
        context = _lookup("torch._guards", "CompileContext")
        compile_id = context.current_compile_id()
    except (TorchAPIError, AttributeError):
        return ""
    return str(compile_id) if compile_id is not None else ""


def current_compile_frame() -> tuple[int, int] | None:
    """(frame id, compile count within that frame) of the compile in progress: a frame is one code object dynamo
    compiles (a graph break resumes in another); a recompile of it has the same frame id and the next count. None
    outside a compile or where this torch lacks it."""
    try:
        context = _lookup("torch._guards", "CompileContext")
        compile_id = context.current_compile_id()
    except (TorchAPIError, AttributeError):
        return None
    frame = getattr(compile_id, "frame_id", None)
    count = getattr(compile_id, "frame_compile_id", None)
    return (frame, count) if isinstance(frame, int) and isinstance(count, int) else None


def ends_at_graph_break(gm: Any) -> bool:
    """Whether dynamo cut the graph `gm` short, so that more of the step runs after it as other graphs: a graph
    break, or one of DDP's buckets (DDPOptimizer marks every bucket so, the last one too). False where this torch
    does not record why a graph was compiled."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    return bool(getattr(reason, "graph_break", False))


def trace_artifact(name: str, payload_fn: Callable[[], str]) -> None:
    """Emit a JSON artifact named `name` through torch's structured logging (what `TORCH_TRACE=<dir>` writes and
    tlparse shows next to the compile's graphs). `payload_fn` runs only while a trace is being written. Does nothing
    where this torch has no structured logging."""
    try:
        trace_structured = _lookup("torch._logging", "trace_structured")
    except TorchAPIError:
        return
    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": "json"}, payload_fn=payload_fn)
