"""The compilers remat wraps: aot_autograd, inductor and its custom-partitioner hook, the aot_eager inner compiler,
and the dynamo entry points it calls."""
from __future__ import annotations

import importlib
from typing import Any, Callable

from .guard import TorchAPIError, lookup


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """torch's aot_autograd backend factory (fw_compiler=, bw_compiler=, partition_fn=, decompositions=, ...)."""
    return lookup("torch._dynamo.backends.common", "aot_autograd")(**kwargs)


def compile_fx(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """inductor's whole compile of a dynamo graph (config_patches=, inner_compile=)."""
    return lookup("torch._inductor.compile_fx", "compile_fx")(gm, example_inputs, **kwargs)


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
