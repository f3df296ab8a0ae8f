"""The budget-independent plans a heuristic solver chooses from.

A family holds the inner compiler's own plan, the hand-written recipes (recipes.py) and the proposals of the family
builders named (greedy's, mincut's). Where random ops may be replayed, the proposals made with every random op saved
(what rng="save" searches) join it, so allowing replay never yields a worse plan; and for each compute-heavy op kind,
the proposals made with every such output saved, so an empty save list never yields a costlier plan than a one-kind
list. Under inductor, each proposal that recomputes a repeated block's output comes with its twin that saves the
blocks' outputs (_with_outputs_saved). `pick` then takes from it what a budget allows (evaluate.py).
"""

from __future__ import annotations

import dataclasses
import types

from . import greedy, mincut
from .evaluate import Evaluator, Scored
from .problem import Problem
from .recipes import SAVED_OPS, block_outputs, recipes

BUILDERS = {"greedy": greedy.family, "mincut": mincut.family, "mincut-sweep": mincut.sweep_family}
HEAVY_OPS = SAVED_OPS | {"aten.convolution.default"}


def heuristic_family(evaluator: Evaluator, parts: tuple[str, ...] = ("greedy", "mincut-sweep")) -> list[Scored]:
    """The baseline, the recipes and the proposals of the `parts` builders (BUILDERS), with their variants."""
    members = [evaluator.baseline(), *_default_partition(evaluator)]
    members += _with_outputs_saved(evaluator, ("recipes", *parts))
    saving = _random_ops_saved(evaluator.problem)
    if saving is not None:
        members += _with_outputs_saved(evaluator.variant("rng-saved", saving), parts)
    for kind, kept in _heavy_ops_saved(evaluator.problem):
        inner = evaluator.variant(f"saving {kind}", kept)
        members += heuristic_family(inner, parts)
    return members


def _with_outputs_saved(evaluator: Evaluator, parts: tuple[str, ...]) -> list[Scored]:
    """The proposals of the `parts` builders and, under inductor, each proposal that recomputes a block's output
    once more with the blocks' outputs saved.

    inductor computes a value that is not written out inside the loops that read it: a recomputed block output
    inside the next block's loops, and so on down a residual stream recomputed from block to block. Every block's
    kernels then differ from the others' (each compiled on its own: a 4-layer Llama-style model's backward went from
    11 kernels under plain inductor to 21) and repeat the stream's sums for each reader. Saving the outputs keeps
    the blocks alike; the pick takes that plan wherever it meets the budget at no higher cost."""
    built = {**BUILDERS, "recipes": recipe_family}
    proposals = [s for part in parts for s in evaluator.family(part, built[part])]
    outputs = evaluator.once("block outputs", lambda problem, _: block_outputs(problem) if problem.fuses else None)
    if not outputs:
        return proposals
    return proposals + [
        evaluator.score(s.chosen - outputs, f"{s.label}, block outputs saved" if s.label else "")
        for s in proposals
        if s.chosen & outputs
    ]


def _default_partition(evaluator: Evaluator) -> list[Scored]:
    """torch's default partition (gradient formulas computed in backward), where it is not the baseline already:
    the baseline of a plan with a save list, so a plan without one chooses from it too."""
    problem = evaluator.problem
    formulas = problem.graph.formula_values
    if not formulas or problem.baseline.saved is None:
        return []
    return [evaluator.score(formulas, "default partition")]


def recipe_family(problem: Problem, evaluator: Evaluator) -> list[Scored]:
    return [evaluator.score(chosen, name) for name, chosen in recipes(problem)]


def _heavy_ops_saved(problem: Problem) -> list[tuple[str, Problem]]:
    """For each compute-heavy op kind (matmuls, attention, convolution) with a choosable output, the same problem
    with every such output saved, as `save_ops=[kind]` would keep them. None under a save list."""
    if problem.constraints.kinds_saved:
        return []
    graph = problem.graph
    by_kind: dict[str, set[str]] = {}
    for name in problem.choosable:
        if graph[name].op in HEAVY_OPS:
            by_kind.setdefault(graph[name].op, set()).add(name)
    return [
        (kind, _with_saved(problem, names, f"save_ops: {kind}", kinds_saved=True))
        for kind, names in sorted(by_kind.items())
    ]


def _with_saved(problem: Problem, names: set[str], reason: str, kinds_saved: bool = False) -> Problem:
    """`problem` with `names` saved (no longer choosable)."""
    c = problem.constraints
    must_save = dict(c.must_save, **{n: reason for n in names})
    constraints = dataclasses.replace(
        c,
        must_save=types.MappingProxyType(must_save),
        kinds_saved=c.kinds_saved or kinds_saved,
        by_option=c.by_option | names,
    )
    return problem.constrained(constraints, tuple(n for n in problem.choosable if n not in names))


def _random_ops_saved(problem: Problem) -> Problem | None:
    """The same problem with every replayable random op saved, or None when no random op is choosable."""
    graph = problem.graph
    random_ops = set(problem.constraints.replay)
    outputs = {u for n in random_ops if graph[n].is_multi for u in graph[n].users if graph[u].op == "getitem"}
    replayable = (random_ops | outputs) & set(problem.choosable)
    if not replayable:
        return None
    return _with_saved(problem, replayable, "rng: random op saved")
