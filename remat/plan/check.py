"""Invariant checks of a plan (run when RematConfig.debug is set)."""
from __future__ import annotations

from ..capture import Role
from .problem import Problem, Resolved
from .schedule import backward_order, forward_order


class PlanInvariantError(AssertionError):
    """A plan broke one of remat's invariants: a bug in remat, never a user error."""


def check_plan(problem: Problem, resolved: Resolved) -> None:
    """Every backward read is covered by a saved, recomputed or input value computed before it; nothing is both
    saved and recomputed; nothing is recomputed twice; must-save values are never recomputed."""
    graph = problem.graph
    both = resolved.saved & resolved.recomputed
    if both:
        raise PlanInvariantError(f"values both saved and recomputed: {sorted(both)}")
    forced = resolved.recomputed & set(problem.constraints.must_save)
    if forced:
        raise PlanInvariantError(f"must-save values recomputed: {sorted(forced)}")
    order = backward_order(problem, resolved)
    if len(order) != len(set(order)):
        raise PlanInvariantError("a value is recomputed twice in the backward schedule")
    fw = set(forward_order(problem, resolved))
    missing = resolved.saved - fw
    if missing:
        raise PlanInvariantError(f"saved values the forward does not compute: {sorted(missing)}")
    available = set(resolved.saved) | set(resolved.inputs)
    for name in order:
        for inp in graph[name].inputs:
            role = graph[inp].role
            if role is Role.TANGENT or inp in available:
                continue
            if role is Role.PRIMAL and graph[inp].is_tensor is False:
                continue  # symbolic sizes of inputs travel as integers
            raise PlanInvariantError(f"backward node {name} ({graph[name].op}) reads {inp}, which is neither "
                                     "saved, recomputed earlier, nor an input")
        available.add(name)
