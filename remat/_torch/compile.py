"""The compilers remat wraps: aot_autograd, inductor and its custom-partitioner hook, the aot_eager inner compiler,
and the dynamo entry points it calls."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..code_version import code_version
from .guard import TorchAPIError, lookup, missing


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """torch's aot_autograd backend factory (fw_compiler=, bw_compiler=, partition_fn=, decompositions=, ...)."""
    return lookup("torch._dynamo.backends.common", "aot_autograd")(**kwargs)


def compile_fx(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """inductor's whole compile of a dynamo graph (config_patches=, inner_compile=), with aot_autograd's cache off:
    a hit there would skip remat's partitioner, so no plan would be made or recorded (explain, the step's ledger).
    inductor's graph cache still serves each planned forward and backward module."""
    compile_fx = lookup("torch._inductor.compile_fx", "compile_fx")
    functorch = importlib.import_module("torch._functorch.config")
    if not hasattr(functorch, "enable_autograd_cache"):
        return compile_fx(gm, example_inputs, **kwargs)
    with functorch.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, **kwargs)


def compile_fx_inner() -> Callable[..., Any]:
    """inductor's compiler of one forward or backward module, as aot_autograd's fw/bw compiler."""
    return lookup("torch._inductor.compile_fx", "compile_fx_inner")


def inductor_decompositions() -> Any:
    """The decomposition table inductor traces with."""
    return lookup("torch._inductor.decomposition", "select_decomp_table")()


def custom_partitioner_base() -> type | None:
    """inductor's CustomPartitionerFn base class, or None when this torch has no custom-partitioner hook."""
    try:
        base = lookup("torch._inductor.custom_graph_pass", "CustomPartitionerFn")
        config = importlib.import_module("torch._inductor.config")
    except (TorchAPIError, ImportError):
        return None
    return base if hasattr(config, "custom_partitioner_fn") else None


def boxed_nop() -> Callable[..., Any]:
    """torch's aot_eager inner compiler: runs the module as generated Python with the boxed calling convention, so
    each input is released after its last use. Falls back to fx.Interpreter.boxed_run, which frees the same way."""
    try:
        return lookup("torch._dynamo.backends.debugging", "boxed_nop")
    except TorchAPIError:
        return boxed_interpreter


def boxed_interpreter(gm: Any, _inputs: Any) -> Callable[..., Any]:
    import torch.fx as fx

    def run(args: list) -> Any:
        return fx.Interpreter(gm).boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def mark_dynamic(tensor: Any, dim: int) -> None:
    """Have dynamo trace dimension `dim` of `tensor` as a symbolic size."""
    lookup("torch._dynamo", "mark_dynamic")(tensor, dim)


def ends_at_graph_break(gm: Any) -> bool:
    """Whether dynamo cut the graph `gm` short, so that more of the step runs after it as other graphs: a graph
    break, or one of DDP's buckets (DDPOptimizer marks every bucket so, the last one too). False where this torch
    does not record why a graph was compiled."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    return bool(getattr(reason, "graph_break", False))


# Segments of a backward module and inductor's horizontal fusion. The rewrite numbers the segments of each backward
# module it builds: a run of recomputed nodes and the backward work after it up to the next run. inductor
# fuses loops that read the same buffers wherever they sit in the module: a loop fused with an earlier one runs
# there, and what it waits for (the recomputation of another layer, the gradient it reads) is pulled ahead with it,
# out of the place the plan gave it. While inductor lowers a module remat built, its fusion choices refuse
# horizontal fusion across segments; vertical fusion (a producer into its consumer) is untouched.
BLOCK = "remat_block"


def fusion_barrier_supported() -> bool:
    """Whether this torch lets remat keep backward segments apart in inductor's fusion (InductorChoices and a
    scoped choices handler)."""
    return _choices_parts() is not None


def _choices_parts() -> tuple[type, Any] | None:
    try:
        base = lookup("torch._inductor.choices", "InductorChoices")
        virtualized = lookup("torch._inductor.virtualized", "V")
    except TorchAPIError:
        return None
    if not hasattr(base, "can_fuse_horizontal") or not hasattr(virtualized, "set_choices_handler"):
        return None
    return base, virtualized


def _blocks(snode: Any) -> frozenset:
    """The segments of the nodes a scheduler node computes (those inductor created unmarked are left out)."""
    found = set()
    for sub in snode.get_nodes():
        for origin in getattr(getattr(sub, "node", None), "origins", None) or ():
            meta = getattr(origin, "meta", None) or {}
            if BLOCK in meta:
                found.add(meta[BLOCK])
    return frozenset(found)


def fusion_barrier(gm: Any) -> Any:
    """A context manager under which inductor, lowering `gm`, fuses no two loops horizontally that belong to
    different segments. A null context when `gm` has no marked segment or this torch lacks the hook."""
    import contextlib

    parts = _choices_parts()
    if parts is None or not any(BLOCK in n.meta for n in gm.graph.nodes):
        return contextlib.nullcontext()
    base, virtualized = parts

    class BlockChoices(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def can_fuse_horizontal(scheduler, node1, node2, shared_data_score):
            one, two = _blocks(node1), _blocks(node2)
            if one and two and one != two:
                return False
            return base.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)

    return virtualized.set_choices_handler(BlockChoices())


def _keyed_pass_base() -> type:
    """The class whose instances inductor's graph cache keys by their uuid when set as `_pre_fusion_custom_pass`:
    CustomSchedulerPass where this torch has it (2.13 does), else CustomGraphPass (2.11 keys every custom pass by it);
    `object` where this torch has neither (the graph is then not cached)."""
    for name in ("CustomSchedulerPass", "CustomGraphPass"):
        try:
            return lookup("torch._inductor.custom_graph_pass", name)
        except TorchAPIError:
            continue
    return object


def inputs_never_reused(overloads: Any) -> Any:
    """A context manager under which inductor never reuses, for buffers of its own, the memory of a tensor that a
    call of one of `overloads` reads (as it treats the inputs of collectives): the op's kernel may still be reading
    it after it returned, from a copy on a side stream. Released normally, the memory goes back to the caching
    allocator, which holds it until the copy is done (record_stream). A pass before inductor's fusion names those
    buffers; one the user configured runs first. The pass has a stable uuid, so inductor's graph cache keeps
    working: a torch with CustomSchedulerPass (2.13) keys a pre-fusion pass of that class by it, 2.11 one that is a
    CustomGraphPass (`_keyed_pass_base`). Where the user's own pass has no uuid, the pass is neither, and inductor
    does not cache the graph (as it would not with the user's pass alone)."""
    config = importlib.import_module("torch._inductor.config")
    if not hasattr(config, "_pre_fusion_custom_pass"):
        raise missing("torch._inductor.config._pre_fusion_custom_pass")
    virtualized = lookup("torch._inductor.virtualized", "V")
    targets = frozenset(overloads)
    previous = config._pre_fusion_custom_pass
    before = None if previous is None else getattr(previous, "uuid", lambda: None)()
    keyed = previous is None or before is not None
    base = _keyed_pass_base() if keyed else object

    class NeverReuse(base):  # type: ignore[misc, valid-type]
        def __call__(self, nodes: list) -> list:
            if previous is not None:
                nodes = previous(nodes)
            for snode in nodes:
                for sub in snode.get_nodes():
                    if getattr(getattr(sub, "node", None), "op_overload", None) in targets:
                        virtualized.graph.never_reuse_buffers.update(dep.name for dep in sub.read_writes.reads)
            return nodes

        def uuid(self) -> Any:
            key = ("remat.inputs_never_reused", code_version(), tuple(sorted(map(str, targets))), before)
            return key if keyed else None

    return config.patch(_pre_fusion_custom_pass=NeverReuse())


# Ops whose outputs inductor does not allocate itself, whatever its fallback registry holds: a convolution runs as a
# library call that returns its own tensor (ExternKernelAlloc); attention on CPU falls back (torch 2.11-2.14).
KNOWN_FALLBACKS = frozenset(
    {
        "aten.convolution.default",
        "aten.convolution_backward.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
    }
)


def inductor_fallback_ops() -> frozenset[str]:
    """Names ("aten.cumsum.default") of the ops inductor runs as library calls that allocate their own outputs (its
    lowering registry's fallbacks) and KNOWN_FALLBACKS. On a torch whose registry cannot be read, KNOWN_FALLBACKS."""
    try:
        registered = lookup("torch._inductor.lowering", "fallbacks")
    except TorchAPIError:
        return KNOWN_FALLBACKS
    return KNOWN_FALLBACKS | frozenset(str(op) for op in registered if hasattr(op, "_schema"))
