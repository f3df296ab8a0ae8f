"""The checkpointing recipes users write by hand, as candidate plans.

From the module path each node carries, remat finds the model's repeated blocks (the outermost numbered container
with at least two children: `blocks.0`, `blocks.1`, ... or `transformer.h.0`, ...) and builds the plans these
recipes would run:

- per-block checkpoint (`torch.utils.checkpoint` around every block): a block's outputs read outside it are saved
  (they are the next block's input), everything else inside it is recomputed;
- every-k-blocks: the same around groups of k consecutive blocks;
- selective layer (checkpoint every k-th block, keep the others as they are);
- op-level selective checkpoint (torchtitan's recipe): inside each block, the outputs of matmuls and attention are
  saved and everything else is recomputed; without blocks, the same over the whole graph;
- Megatron-style selective: only the attention core (the score matmuls, masking, softmax, dropout) is recomputed.

Each recipe is a choice of values to recompute, named so the plan can say which recipe it reproduces; the
simulator scores it like any other candidate. Pure functions of the problem.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from ..capture import Graph, Role
from .problem import Problem

SAVED_OPS = frozenset(
    {
        "aten.mm.default",
        "aten.addmm.default",
        "aten.bmm.default",
        "aten.baddbmm.default",
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_attention_math.default",
        "aten._scaled_dot_product_fused_attention_overrideable.default",
    }
)
_PROJECTIONS = frozenset({"aten.mm.default", "aten.addmm.default"})
_NUMBERED = re.compile(r"^(.*?)\.?(\d+)$")
_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
MAX_GROUP = 4  # every-k-blocks and selective-layer recipes for k = 2 .. MAX_GROUP
PER_BLOCK = "per-block checkpoint"


def blocks(problem: Problem) -> dict[str, int]:
    """Forward value → the position of the repeated block it belongs to (values outside every block are absent).
    Found once per problem and its variants (Problem.graph_fact); the caller does not change it."""
    return problem.graph_fact("blocks", lambda p: _blocks(p.graph))


def _blocks(graph: Graph) -> dict[str, int]:
    children: dict[str, set[int]] = {}
    for path in {v.module_path for v in graph.values}:  # a block's values share a few paths
        parts = path.split(".") if path else []
        for depth, part in enumerate(parts):
            if part.isdigit():
                children.setdefault(".".join(parts[:depth]), set()).add(int(part))
    containers = [c for c, idx in children.items() if len(idx) >= 2]
    if not containers:
        return {}
    container = min(containers, key=lambda c: (c.count(".") + (c != ""), c))
    prefix = f"{container}." if container else ""
    order = {i: p for p, i in enumerate(sorted(children[container]))}
    found = {}
    for v in graph.values:
        if v.role is Role.FORWARD and v.module_path.startswith(prefix):
            head = v.module_path[len(prefix) :].split(".", 1)[0]
            if head.isdigit():
                found[v.name] = order[int(head)]
    return found


def block_outputs(problem: Problem) -> frozenset[str]:
    """The choosable values of the repeated blocks that forward nodes outside their block read (a block's output,
    the next block's input), with the values sharing their storage."""
    block = blocks(problem)
    in_blocks = frozenset(n for n in problem.choosable if n in block)
    return in_blocks - _inside(problem, PER_BLOCK, _same)


def _same(b: int) -> int:
    return b


def _of_group(k: int, b: int) -> int:
    """The group of k consecutive blocks block `b` is in."""
    return b // k


def _if_kth(k: int, b: int) -> int | None:
    """Block `b` where it is every k-th block, else None."""
    return b if b % k == 0 else None


def _inside(problem: Problem, name: str, grouping: Callable[[int], int | None]) -> frozenset[str]:
    """The choosable values of the blocks grouped by `grouping` (block position → group, None: left out) that no
    forward node outside their group reads. Which values those are is found once per problem and its variants
    (Problem.graph_fact), under the recipe's `name`."""
    inside = problem.graph_fact(f"recipe {name}", lambda p: _inside_groups(p, grouping))
    return inside.intersection(problem.choosable)


def _inside_groups(problem: Problem, grouping: Callable[[int], int | None]) -> frozenset[str]:
    """The values of the grouped blocks that no forward node outside their group reads, nor one sharing their
    storage (`_inside`). Only a value read outside its own block (_crossings) can be read outside its group."""
    value = problem.graph.by_name
    block = blocks(problem)
    of_block = {b: grouping(b) for b in set(block.values())}
    group = {n: g for n, b in block.items() if (g := of_block[b]) is not None}
    kept = {
        value[name].storage
        for name, read_in in _crossings(problem).items()
        if (g := group.get(name)) is not None and any(b is None or of_block[b] != g for b in read_in)
    }
    views = _views(problem)
    return frozenset(group.keys() - kept - {v for s in kept for v in views.get(s, ())})


def _views(problem: Problem) -> dict[str, tuple[str, ...]]:
    """Per storage, the values that are views of it (their storage is another value's): a fact of the graph."""

    def build(p: Problem) -> dict[str, tuple[str, ...]]:
        found: dict[str, list[str]] = {}
        for v in p.graph.values:
            if v.storage != v.name:
                found.setdefault(v.storage, []).append(v.name)
        return {s: tuple(names) for s, names in found.items()}

    return problem.graph_fact("views", build)


def _crossings(problem: Problem) -> dict[str, frozenset[int | None]]:
    """The block values a forward node or output of another block, or of none, reads: per value, the blocks of its
    forward readers (None: outside every block). Found once per problem and its variants."""
    return problem.graph_fact("block crossings", _crossings_of)


def _crossings_of(problem: Problem) -> dict[str, frozenset[int | None]]:
    roles, value, block = (Role.FORWARD, Role.OUTPUT), problem.graph.by_name, blocks(problem)
    found = {}
    for name, b in block.items():
        read_in = frozenset(block.get(u) for u in value[name].users if value[u].role in roles)
        if read_in - {b}:
            found[name] = read_in
    return found


def recipes(problem: Problem) -> list[tuple[str, frozenset[str]]]:
    """(recipe name, values it recomputes) for every recipe that applies to this graph, in a fixed order."""
    graph = problem.graph
    block = blocks(problem)
    count = len(set(block.values()))
    out: list[tuple[str, frozenset[str]]] = []
    if count >= 2:
        out.append((PER_BLOCK, _inside(problem, PER_BLOCK, _same)))
        for k in range(2, min(MAX_GROUP, count) + 1):
            every = f"every-{k}-blocks checkpoint"
            out.append((every, _inside(problem, every, functools.partial(_of_group, k))))
            kth = f"checkpoint every {k}th block"
            out.append((kth, _inside(problem, kth, functools.partial(_if_kth, k))))
        per_block = out[0][1]
        out.append(("op-level SAC", frozenset(n for n in per_block if graph[n].op not in SAVED_OPS)))
    everywhere = frozenset(n for n in problem.choosable if graph[n].op not in SAVED_OPS)
    out.append(("op-level SAC (whole graph)", everywhere))
    core = _attention_core(problem)
    if core:
        out.append(("Megatron selective (attention core)", core))
    unique: dict[frozenset[str], str] = {}  # the first name of each distinct, non-empty set
    for name, chosen in out:
        if chosen:
            unique.setdefault(chosen, name)
    return [(name, chosen) for chosen, name in unique.items()]


def _attention_core(problem: Problem) -> frozenset[str]:
    """Values computed inside attention modules between the projections: not a projection's output, not read by a
    projection, not read outside the attention module."""
    graph = problem.graph
    module = problem.graph_fact("attention modules", _attention_modules)
    core = set()
    for name in problem.choosable:
        v = graph[name]
        scope = module.get(name)
        if not scope or v.op in _PROJECTIONS or _feeds_projection(graph, name):
            continue
        if any(graph[u].role in (Role.FORWARD, Role.OUTPUT) and module.get(u) != scope for u in v.users):
            continue
        core.add(name)
    return frozenset(core)


def _attention_modules(problem: Problem) -> dict[str, str]:
    """Per forward value, its attention module (_attention_module): found once per module path."""
    forward = [v for v in problem.graph.values if v.role is Role.FORWARD]
    scopes = {path: _attention_module(path) for path in {v.module_path for v in forward}}
    return {v.name: scopes[v.module_path] for v in forward}


def _attention_module(path: str) -> str:
    """The innermost module path whose last name says attention ("blocks.0.attn"), or ""."""
    parts = path.split(".") if path else []
    for depth in range(len(parts), 0, -1):
        if _ATTENTION.search(parts[depth - 1]) and not parts[depth - 1].endswith(("drop", "dropout")):
            return ".".join(parts[:depth])
    return ""


def _feeds_projection(graph, name: str) -> bool:
    """A projection (mm/addmm) reads the value, directly or through views."""
    stack = [name]
    while stack:
        for u in graph[stack.pop()].users:
            user = graph[u]
            if user.op in _PROJECTIONS:
                return True
            if user.is_view and user.role is Role.FORWARD:
                stack.append(u)
    return False
