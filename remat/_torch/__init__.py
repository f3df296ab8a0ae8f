"""Every private torch API remat uses, looked up in this package and guarded; no other module of remat reaches
torch's private modules, names or node metadata (tests/test_torch_boundary.py checks).

torch 2.11–2.14 are supported. Each helper checks that the API exists and fails with a message that names the torch
version and the missing piece instead of an AttributeError from deep inside a compile.

- guard: the supported versions, TorchAPIError and the lookup the other modules use
- graph: op classes and schemas, pytrees, torch's own node metadata, symbolic sizes, opaque values
- split: torch's forward/backward module builder and its default and min-cut partitioners
- compile: aot_autograd, inductor and its custom-partitioner hook, the aot_eager inner compiler, mark_dynamic
- dynamo: the compile in progress, structured traces, forgetting a block's compiles
- runtime: storage sharing, tensor versions, RNG replay ops, fake mode, profiler allocation records, the CUDA
  allocator's trace
- eager: wrap-policy objects, batch norm's base class
"""

from .compile import (
    BLOCK,
    aot_autograd,
    boxed_interpreter,
    boxed_nop,
    compile_fx,
    compile_fx_inner,
    custom_partitioner_base,
    ends_at_graph_break,
    fusion_barrier,
    fusion_barrier_supported,
    inputs_never_reused,
    inductor_decompositions,
    inductor_fallback_ops,
    mark_dynamic,
)
from .dynamo import current_compile_frame, current_compile_id, forget_compiles, trace_artifact
from .eager import BatchNormBase, wrap_policy_targets
from .graph import (
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    checkpoint_mark,
    input_descriptor,
    is_mutable_op,
    is_opaque,
    is_sym_node,
    module_stack,
    mutated_input_descriptors,
    op_schema,
    origin_name,
    overload_name,
    partitioner_tag,
    subclass_component,
    sym_node_expr,
    sym_node_hint,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_unflatten,
)
from .guard import SUPPORTED_TORCH, TorchAPIError
from .split import (
    activation_memory_budget,
    default_partition,
    extract_fwd_bwd_modules,
    lazy_graph_modules,
    min_cut_cse,
    min_cut_partition,
    min_cut_saved,
    split_joint,
)
from .runtime import (
    cuda_allocator_trace,
    cuda_history_recording,
    eager_dispatch,
    is_allocation,
    rng_replay_ops,
    storage_use_count,
    tensor_version,
)

__all__ = [
    "BLOCK",
    "BatchNormBase",
    "HigherOrderOperator",
    "OpOverload",
    "OpOverloadPacket",
    "SUPPORTED_TORCH",
    "TorchAPIError",
    "activation_memory_budget",
    "aot_autograd",
    "boxed_interpreter",
    "boxed_nop",
    "checkpoint_mark",
    "compile_fx",
    "compile_fx_inner",
    "cuda_allocator_trace",
    "cuda_history_recording",
    "current_compile_frame",
    "current_compile_id",
    "custom_partitioner_base",
    "default_partition",
    "eager_dispatch",
    "ends_at_graph_break",
    "extract_fwd_bwd_modules",
    "forget_compiles",
    "fusion_barrier",
    "fusion_barrier_supported",
    "inputs_never_reused",
    "inductor_fallback_ops",
    "inductor_decompositions",
    "input_descriptor",
    "is_allocation",
    "is_mutable_op",
    "is_opaque",
    "is_sym_node",
    "mark_dynamic",
    "lazy_graph_modules",
    "min_cut_cse",
    "min_cut_partition",
    "min_cut_saved",
    "module_stack",
    "mutated_input_descriptors",
    "op_schema",
    "origin_name",
    "overload_name",
    "partitioner_tag",
    "rng_replay_ops",
    "split_joint",
    "storage_use_count",
    "subclass_component",
    "sym_node_expr",
    "sym_node_hint",
    "tensor_version",
    "trace_artifact",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_unflatten",
    "wrap_policy_targets",
]
