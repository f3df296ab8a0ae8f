"""Joint forward+backward graph → Graph facts.

The facts are plain frozen values keyed by node name: role, bytes (concrete at the size hint and as a sympy
expression), storage owner (views share their base's storage), inputs and users, schedule position. Nothing is
written onto the fx nodes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import re
from typing import Any, Mapping

import sympy
import torch
import torch.fx as fx

from . import _torch


class Role(enum.Enum):
    PRIMAL = "primal"  # forward input: parameters, buffers, user inputs
    TANGENT = "tangent"  # incoming gradient of a forward output
    FORWARD = "forward"  # computable without any tangent
    BACKWARD = "backward"  # depends on a tangent
    OUTPUT = "output"


@dataclasses.dataclass(frozen=True, slots=True)
class Value:
    """Facts about one node of the joint graph (slots: a large graph holds hundreds of thousands)."""

    name: str
    index: int  # position in the joint graph
    role: Role
    op: str  # "aten.mm.default", "getitem", "placeholder", ...
    inputs: tuple[str, ...]  # distinct input node names, in argument order
    users: tuple[str, ...]  # distinct user node names, in schedule order
    nbytes: int  # bytes of the storage this node allocates, at the size hint (0 for views and non-tensors)
    nbytes_expr: sympy.Expr  # the same, symbolic under dynamic shapes
    storage: str  # name of the node that owns the storage this value lives in
    is_tensor: bool
    is_view: bool  # aliases its input's storage
    is_multi: bool  # returns a tuple; its getitem users carry the tensors
    shape: tuple
    dtype: str
    module_path: str  # "blocks.3.attn" from the node's module stack, "" if unknown
    tags: frozenset[str]  # torch.Tag names of the op, plus remat's own markers
    device: str = ""  # device type of the (first) tensor it returns: "cpu", "cuda"; "" if none
    origin: str = ""  # the node of the dynamo graph this node was traced from ("" if unknown)
    is_opaque: bool = False  # an opaque object (process group, device mesh, script object): no bytes, never moved
    # An input unwrapped from a tensor subclass (a DTensor's local shard under tensor parallelism): the subclass
    # attribute it holds, "_local_tensor"; "" for a plain input and every other node.
    subclass_attr: str = ""
    group: str = ""  # a collective's process group name ("" for other nodes)


@dataclasses.dataclass(frozen=True)
class Graph:
    """Facts of a joint graph, in schedule (joint-graph) order."""

    values: tuple[Value, ...]
    num_fwd_outputs: int
    fw_outputs: tuple[str, ...]  # names of the user-visible forward outputs
    bw_outputs: tuple[str, ...]  # names of the gradient outputs
    symbols: tuple[str, ...]  # free symbols of the byte expressions (dynamic shapes)
    mutated_inputs: tuple[str, ...] = ()  # primals the step mutates in place (their new value is a forward output)
    by_name: Mapping[str, Value] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {v.name: v for v in self.values})

    @functools.cached_property
    def forward_required(self) -> frozenset[str]:
        """Forward values the user-visible forward outputs depend on."""
        seen: set[str] = set()
        stack = [n for n in self.fw_outputs if self[n].role is Role.FORWARD]
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(i for i in self[name].inputs if self[i].role is Role.FORWARD)
        return frozenset(seen)

    @functools.cached_property
    def formula_values(self) -> frozenset[str]:
        """Forward values traced in the backward pass (gradient-formula factors computed from forward values alone,
        forward only under capture's min-cut view): what torch's default partition computes in backward."""
        return frozenset(v.name for v in self.values if v.role is Role.FORWARD and BACKWARD_FORMULA in v.tags)

    def __getitem__(self, name: str) -> Value:
        return self.by_name[name]

    def of_role(self, role: Role) -> list[Value]:
        return [v for v in self.values if v.role is role]


def op_name(node: fx.Node) -> str:
    if node.op != "call_function":
        return node.op
    target = node.target
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, _torch.OpOverload):
        return f"{target.namespace}.{_torch.op_schema(target).name.split('::')[-1]}.{_torch.overload_name(target)}"
    return getattr(target, "__name__", str(target))


def _is_view_op(node: fx.Node) -> bool:
    """True if the node's output aliases its first input: view ops, and getitems of ops returning lists of views
    (split, unbind, chunk)."""
    target = node.target
    if target is operator.getitem and isinstance(node.args[0], fx.Node):
        return returns_alias(node.args[0].target)
    if not isinstance(target, _torch.OpOverload):
        return False
    if target in (torch.ops.aten._unsafe_view.default, torch.ops.aten.alias.default):
        return True
    return len(_torch.op_schema(target).returns) == 1 and returns_alias(target)


def returns_alias(target: object) -> bool:
    if not isinstance(target, _torch.OpOverload) or len(_torch.op_schema(target).returns) != 1:
        return False
    info = _torch.op_schema(target).returns[0].alias_info
    return info is not None and not info.is_write


def hooked_nodes(gm: fx.GraphModule) -> frozenset[str]:
    """Names of the nodes of a dynamo graph that a tensor hook is registered on (`tensor.register_hook` inside the
    compiled region, traced as the register_hook higher-order op)."""
    return frozenset(
        n.args[0].name
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, _torch.HigherOrderOperator)
        and n.target.name() == "register_hook"
        and n.args
        and isinstance(n.args[0], fx.Node)
    )


# Namespaces of torch's functional collectives (all_reduce, all_gather_into_tensor, ...), as ops in a traced graph.
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional")


def _tags(node: fx.Node) -> frozenset[str]:
    target = node.target
    names: set[str] = set()
    if isinstance(target, _torch.OpOverload):
        names.update(str(t).split(".")[-1] for t in target.tags)
        if _torch.is_mutable_op(target):
            names.add("mutable")
        if target.namespace in (*COLLECTIVE_NAMESPACES, "_dtensor"):
            names.add("collective")
        name = target.name().split("::")[-1]
        # inductor's random ops draw from the seeds tensor `inductor_seeds` made: deterministic given that input.
        if target.namespace == "prims" and name.startswith(("inductor_random", "inductor_randint")):
            names.add("seeded_random")
    return frozenset(sorted(names))


def _group_name(node: fx.Node) -> str:
    """The process group a functional collective runs over, by name; "" for any other node."""
    target = node.target
    if not isinstance(target, _torch.OpOverload) or target.namespace not in COLLECTIVE_NAMESPACES:
        return ""
    for i, spec in enumerate(_torch.op_schema(target).arguments):
        if spec.name == "group_name":
            value = node.args[i] if i < len(node.args) else node.kwargs.get("group_name", "")
            return value if isinstance(value, str) else ""
    return ""


def sym_expr(x: Any) -> sympy.Expr:
    """A size (int or SymInt) as a sympy expression."""
    if isinstance(x, torch.SymInt):
        return sympy.sympify(_torch.sym_node_expr(x))
    return sympy.Integer(int(x))


def sym_hint(x: Any) -> int:
    """A size (int or SymInt) evaluated at its hint."""
    if isinstance(x, torch.SymInt):
        return _torch.sym_node_hint(x)
    return int(x)


def tensor_bytes(x: object) -> int:
    """Bytes of a tensor's elements at the size hint; 0 for anything that is not a tensor."""
    return sym_hint(x.numel()) * x.element_size() if isinstance(x, torch.Tensor) else 0


def _tensor_bytes_expr(val: torch.Tensor) -> sympy.Expr:
    """Bytes of a tensor's elements as a function of the dynamic sizes."""
    numel = val.numel()
    if not isinstance(numel, torch.SymInt):
        return sympy.Integer(numel * val.element_size())
    return sympy.expand(sym_expr(numel) * val.element_size())


def _module_path(node: fx.Node, cleaned: dict[str, str]) -> str:
    """The node's module path (_clean_path), cleaned once per distinct path through `cleaned`."""
    stack = _torch.module_stack(node)
    if not stack:
        return ""
    path = next(reversed(stack.values()))
    path = path[0] if isinstance(path, tuple) else str(path)
    found = cleaned.get(path)
    if found is None:
        found = cleaned[path] = _clean_path(path)
    return found


def _clean_path(path: str) -> str:
    """The module's attribute path below the model dynamo traced from.

    dynamo writes a source expression for the root, then the submodule path with dots: "L['self'].blocks.0.attn"
    (a compiled module), "L['fn'].args[0].blocks.0" (a functools.partial over the model), "L['model'].head" (the
    model passed as an argument), "G['model'].head" (a global). Registered submodules never appear in brackets, so
    the path is what follows the last "]".
    """
    path = re.sub(r"\._modules\[(['\"])(.*?)\1\]", r".\2", path)  # older dynamo: L['self']._modules['blocks']
    return path.rsplit("]", 1)[-1].lstrip(".")


def capture(joint: fx.GraphModule, num_fwd_outputs: int, traced_backward: bool = True) -> Graph:
    """Read the facts of an aot_autograd joint graph. Pure: the graph is not modified.

    A node is backward if it reads a tangent. With `traced_backward`, so is a node aot_autograd traced in the
    backward pass (its partitioner tag), e.g. sin(x) for the gradient of cos: torch's default partition runs such
    nodes in backward. Without it they are forward values that may be saved or recomputed, as torch's min-cut
    partitioner treats them (only a mutating one, or one tagged must_be_in_backward, stays in backward)."""
    nodes = list(joint.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    tangent_dependent: set[str] = set()
    for node in nodes:
        if node.op == "placeholder" and node.name.startswith("tangents"):
            tangent_dependent.add(node.name)
        elif node.op == "call_function" and (
            _in_backward(node, traced_backward) or any(a.name in tangent_dependent for a in node.all_input_nodes)
        ):
            tangent_dependent.add(node.name)

    storage: dict[str, str] = {}
    values: list[Value] = []
    tags: dict[object, frozenset[str]] = {}  # per (op, traced in backward): _tags_of
    names: dict[object, str] = {}
    views: dict[object, bool] = {}
    paths: dict[str, str] = {}
    dtypes: dict[torch.dtype, str] = {}
    symbols: set[str] = set()
    shapes: dict[tuple, tuple] = {}  # one tuple per distinct shape: the graph's values live as long as it does
    for index, node in enumerate(nodes):
        inputs = tuple(dict.fromkeys(a.name for a in node.all_input_nodes))
        readers = sorted(node.users, key=position.__getitem__) if len(node.users) > 1 else node.users
        users = tuple(u.name for u in readers)
        val = node.meta.get("val")
        is_tensor = isinstance(val, torch.Tensor)
        target = node.target
        called = node.op == "call_function"
        is_multi = isinstance(val, (tuple, list)) and called
        if called:
            key = (
                (target, node.args[0].target)
                if target is operator.getitem and isinstance(node.args[0], fx.Node)
                else target
            )
            if key not in views:
                views[key] = _is_view_op(node)
            if target not in names:
                names[target] = op_name(node)
        is_view = is_tensor and called and views[key]
        if is_view and inputs:
            base = node.args[0].args[0] if node.target is operator.getitem else node.args[0]
            base = base.name if isinstance(base, fx.Node) else inputs[0]
            storage[node.name] = storage.get(base, base)
        else:
            storage[node.name] = node.name
        if is_tensor and not is_view:
            numel = val.numel()
            if isinstance(numel, torch.SymInt):
                nbytes, expr = tensor_bytes(val), _tensor_bytes_expr(val)
                symbols.update(str(s) for s in expr.free_symbols)
            else:  # a static size: no symbols
                nbytes = numel * val.element_size()
                expr = sympy.Integer(nbytes)
        else:
            nbytes, expr = 0, sympy.Integer(0)
        values.append(
            Value(
                name=node.name,
                index=index,
                role=_role(node, tangent_dependent),
                op=names[target] if called else node.op,
                inputs=inputs,
                users=users,
                nbytes=nbytes,
                nbytes_expr=expr,
                storage=storage[node.name],
                is_tensor=is_tensor,
                is_view=is_view,
                is_multi=is_multi,
                shape=_one(shapes, tuple(sym_hint(s) for s in val.shape)) if is_tensor else (),
                dtype=dtypes.get(val.dtype) or dtypes.setdefault(val.dtype, str(val.dtype).replace("torch.", ""))
                if is_tensor
                else "",
                module_path=_module_path(node, paths),
                tags=_tags_of(node, tags),
                device=_device(val),
                origin=_torch.origin_name(node),
                is_opaque=not is_tensor and _torch.is_opaque(val),
                subclass_attr=_torch.subclass_component(node) if node.op == "placeholder" else "",
                group=_group_name(node),
            )
        )

    out_args = [a for a in _flat_outputs(nodes[-1])]
    fw_out = tuple(a.name for a in out_args[:num_fwd_outputs] if isinstance(a, fx.Node))
    bw_out = tuple(a.name for a in out_args[num_fwd_outputs:] if isinstance(a, fx.Node))
    return Graph(tuple(values), num_fwd_outputs, fw_out, bw_out, tuple(sorted(symbols)), _mutated_inputs(nodes))


def _tags_of(node: fx.Node, seen: dict[object, frozenset[str]]) -> frozenset[str]:
    """The node's Value.tags: its op's torch.Tag names (read once per op: reading schemas is slow), and remat's
    BACKWARD_FORMULA where aot_autograd traced it in the backward pass; one frozenset per distinct set."""
    formula = _torch.partitioner_tag(node) == "is_backward"
    key = (node.target, formula)
    found = seen.get(key)
    if found is None:
        found = seen[key] = _tags(node) | (_FORMULA if formula else frozenset())
    return found


def _one(seen: dict, key: tuple) -> tuple:
    """`key`, or the equal tuple `seen` holds already."""
    return seen.setdefault(key, key)


# remat's marker (a Value tag) for a node aot_autograd traced in the backward pass (part of a gradient formula).
BACKWARD_FORMULA = "backward_formula"
_FORMULA = frozenset({BACKWARD_FORMULA})


def _in_backward(node: fx.Node, traced_backward: bool) -> bool:
    tag = _torch.partitioner_tag(node)
    if tag == "must_be_in_backward":
        return True
    if tag != "is_backward":
        return False
    target = node.target
    return traced_backward or _torch.is_mutable_op(target)


def _mutated_inputs(nodes: list[fx.Node]) -> tuple[str, ...]:
    """Primals the step overwrites in place: written by a mutating op kept in the graph (`copy_(primals_1, mul)`,
    as aot_autograd emits with keep_inference_input_mutations), or functionalized into an extra forward output that
    aot_autograd's runtime copies back (found through the output descriptors it records)."""
    written = set()
    for node in nodes:
        target = node.target
        if node.op == "call_function" and _torch.is_mutable_op(target):
            for arg, spec in zip(node.args, _torch.op_schema(target).arguments):
                if isinstance(arg, fx.Node) and spec.alias_info is not None and spec.alias_info.is_write:
                    written.add(arg.name)
    mutated = _torch.mutated_input_descriptors(nodes[-1])
    return tuple(
        n.name
        for n in nodes
        if n.op == "placeholder" and (n.name in written or (mutated and _torch.input_descriptor(n) in mutated))
    )


def _device(val: Any) -> str:
    first = val[0] if isinstance(val, (tuple, list)) and val else val
    return first.device.type if isinstance(first, torch.Tensor) else ""


def _flat_outputs(output: fx.Node) -> list[Any]:
    return list(_torch.tree_leaves(output.args[0]))


def _role(node: fx.Node, tangent_dependent: set[str]) -> Role:
    if node.op == "placeholder":
        return Role.TANGENT if node.name.startswith("tangents") else Role.PRIMAL
    if node.op == "output":
        return Role.OUTPUT
    if node.op == "get_attr":
        return Role.PRIMAL
    return Role.BACKWARD if node.name in tangent_dependent else Role.FORWARD
