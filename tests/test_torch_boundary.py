"""remat/_torch is the one place that reaches torch's private APIs; every other module of remat uses public torch only.

The scanner reads each module under remat/ with `ast` (remat/_torch/ itself excepted) and flags:

1. Private torch modules: `import torch._x`, `from torch._x import ...`, `from torch.utils._pytree import ...`,
   `importlib.import_module("torch._x")`: any import of a torch module whose dotted path has a component starting
   with "_".
2. Private names from torch: `from torch.x import _Name`, and any attribute chain rooted at a name bound to a torch
   module (`torch._ops.OpOverload`, `torch.utils._pytree.tree_map`, `torch._C`, `dist._functional_collectives`).
   Dunders (`torch.__version__`) are public.
3. Private attributes reached on objects: `obj._name` (and `getattr(obj, "_name")`, `hasattr`, `setattr` with a
   literal name) where `_name` is not a name remat itself defines (a function, class, module-level or class-level
   name, an attribute remat assigns on `self`/`cls`, a keyword or parameter). Objects remat did not define are
   torch's (or another library's), so `tensor._local_tensor` or `op._schema` fails here while `self._cache` passes.
4. Private node meta keys: a string-literal key read from or written to `<x>.meta` (`meta["k"]`, `meta.get("k")`,
   `"k" in meta`, `meta.setdefault`/`pop`) unless it is a key the fx and export docs describe ("val",
   "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack") or one of remat's own (starting "remat").
   Keys torch's partitioners, aot_autograd and checkpointing write for themselves ("recompute", "ac_graph_id",
   "partitioner_tag", "desc", "from_node") are read through remat/_torch.

Ops looked up through `torch.ops` are public whatever their names (`torch.ops.aten._unsafe_view`,
`torch.ops._c10d_functional.wait_tensor`): `torch.ops` is the public registry of ops. Everything reached without an
underscore is public too. `NOT_TORCH` lists the underscore attributes remat reads that belong to other libraries.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "remat"
BOUNDARY = ROOT / "_torch"
PUBLIC_META_KEYS = frozenset({"val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack"})
# Underscore attributes of other libraries remat keeps or reads, with their owner.
NOT_TORCH = {
    "_checkpoint_fwd_counter": "FairScale's per-module forward counter, which remat's FairScale wrapper maintains",
}
_META_METHODS = frozenset({"get", "setdefault", "pop", "__getitem__", "__contains__"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root_and_chain(node: ast.expr) -> tuple[str | None, list[str]]:
    """`a.b.c` -> ("a", ["b", "c"]); a chain not rooted at a plain name -> (None, [...])."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    chain.reverse()
    return (node.id if isinstance(node, ast.Name) else None), chain


def defined_names(trees: list[ast.Module]) -> set[str]:
    """Every name remat defines: functions, classes, assigned names, attributes assigned on self/cls, parameters,
    keywords, import aliases."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                if node.asname:
                    names.add(node.asname)
                elif not node.name.startswith("torch"):
                    names.add(node.name.split(".")[0])
    return names


def _meta_key(node: ast.AST) -> tuple[ast.AST, str] | None:
    """The literal key of a `<x>.meta` access, or None."""

    def is_meta(value: ast.AST) -> bool:
        return isinstance(value, ast.Attribute) and value.attr == "meta"

    if isinstance(node, ast.Subscript) and is_meta(node.value):
        key = node.slice
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _META_METHODS
        and is_meta(node.func.value)
        and node.args
    ):
        key = node.args[0]
    elif (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.In, ast.NotIn))
        and is_meta(node.comparators[0])
    ):
        key = node.left
    else:
        return None
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return node, key.value
    return None


def scan(source: str, remat_names: set[str], filename: str = "<snippet>") -> list[str]:
    """Each use of a private torch API in `source`, as "file:line: what"."""
    tree = ast.parse(source, filename)
    torch_aliases = {"torch"}
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    if any(_private(part) for part in alias.name.split(".")):
                        flag(node, f"import {alias.name}")
                    torch_aliases.add(alias.asname or "torch")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "torch"
            and node.level == 0
        ):
            if any(_private(part) for part in node.module.split(".")):
                flag(node, f"from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    flag(node, f"from {node.module} import {alias.name}")
                else:
                    # `from torch import distributed as dist`: a torch module under another name
                    torch_aliases.add(alias.asname or alias.name)
    # the attributes that are part of a longer chain (`torch._C` in `torch._C._profiler`): a chain is judged whole
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root, chain = _root_and_chain(node)
            if root in torch_aliases:
                if chain[0] != "ops" and id(node) not in inner and any(_private(part) for part in chain):
                    flag(node, f"{root}.{'.'.join(chain)}")  # torch.ops.*: torch's public registry of ops
                continue
            if _private(node.attr) and node.attr not in remat_names and node.attr not in NOT_TORCH:
                flag(node, f"private attribute .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and _root_and_chain(node.func)[1][-1:] == ["import_module"]
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.split(".")[0] == "torch"
            and any(_private(part) for part in node.args[0].value.split("."))
        ):
            flag(node, f"import_module({node.args[0].value!r})")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
        ):
            name = node.args[1]
            if (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _private(name.value)
                and name.value not in remat_names
                and name.value not in NOT_TORCH
            ):
                flag(node, f"{node.func.id}(..., {name.value!r})")
        meta = _meta_key(node)
        if meta is not None:
            key = meta[1]
            if key not in PUBLIC_META_KEYS and not key.startswith("remat"):
                flag(node, f"node meta key {key!r}")
    return found


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if BOUNDARY not in p.parents and p != BOUNDARY.with_suffix(".py"))


def test_remat_reaches_private_torch_only_through_remat_torch():
    paths = _modules()
    trees = {p: ast.parse(p.read_text(), str(p)) for p in paths}
    names = defined_names(list(trees.values()))
    found = [hit for p in paths for hit in scan(p.read_text(), names, str(p.relative_to(ROOT.parent)))]
    assert not found, "private torch APIs outside remat/_torch:\n" + "\n".join(found)


def test_scanner_flags_each_kind_of_private_use():
    names = {"_cache", "_own"}
    snippet = """
import torch
import torch._dynamo
import torch.distributed as dist
from torch._ops import OpOverload
from torch.utils._pytree import tree_leaves
from torch.nn.modules.batchnorm import _BatchNorm

def f(node, t, op):
    a = torch._C._profiler
    b = dist._functional_collectives
    c = t._local_tensor
    d = op._schema.returns
    e = getattr(t, "_cdata")
    g = node.meta["recompute"]
    h = node.meta.get("partitioner_tag")
    i = "desc" in node.meta
    j = importlib.import_module("torch._inductor.config")
"""
    found = scan(snippet, names)
    expected = [
        "import torch._dynamo",
        "from torch._ops import",
        "from torch.utils._pytree import",
        "import _BatchNorm",
        "torch._C._profiler",
        "dist._functional_collectives",
        "._local_tensor",
        "._schema",
        "'_cdata'",
        "'recompute'",
        "'partitioner_tag'",
        "'desc'",
        "import_module('torch._inductor.config')",
    ]
    for what in expected:
        assert any(what.lstrip(".") in hit for hit in found), (what, found)
    assert len(found) == len(expected), found


def test_scanner_passes_public_uses():
    names = {"_cache", "_own", "_helper"}
    snippet = """
import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

class A:
    def __init__(self):
        self._cache = {}

def f(node, a):
    x = torch.ops.aten.mm.default
    y = torch.__version__
    z = a._cache
    v = node.meta["val"]
    w = node.meta.get("nn_module_stack")
    node.meta["remat_kind"] = "replay"
    return _helper(x), fx.Node
"""
    assert scan(snippet, names) == []
