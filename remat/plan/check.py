"""Invariant checks of a plan: `remat.check_plan(plan)`, and run while compiling under RematConfig(debug=True)."""

from __future__ import annotations

import collections

from ..annotate import Action
from ..capture import Role
from ..runtime.table import MOVES
from .problem import Problem, Resolved
from .schedule import backward_order, forward_order
from .simulate import simulate


class PlanInvariantError(AssertionError):
    """A plan broke one of remat's invariants: a bug in remat, never a user error."""


def check_plan(plan, resolved: Resolved | None = None) -> None:
    """Check a Plan (from `remat.explain`, `remat.last_plan()` or `remat.recent_plans()`) against the graph it was
    made for; raise PlanInvariantError naming the first broken invariant.

    - every value a backward node reads is an input, a tangent, saved, or recomputed earlier in backward;
    - nothing is both saved and recomputed, nothing is recomputed twice, must-save values are never recomputed,
      saved values are computed by the forward;
    - the decisions agree with the saved and recomputed sets;
    - saved bytes, peak, schedule and recompute flops are what the simulator gives for this plan.

    `check_plan(problem, resolved)` checks the structural invariants of a choice before a Plan is made of it.
    """
    if resolved is not None:
        _check_structure(plan, resolved, None)
        return
    problem, resolved = getattr(plan, "problem", None), getattr(plan, "resolved", None)
    if problem is None or resolved is None:
        raise TypeError(
            f"check_plan({type(plan).__name__}): expected a remat.Plan made by remat (explain, last_plan, "
            "recent_plans); this one carries no graph to check it against"
        )
    timeline = plan.timeline
    _check_structure(problem, resolved, list(timeline.steps[timeline.num_forward :]))
    _check_decisions(plan, problem, resolved)
    _check_figures(plan, problem, resolved)


def _check_structure(problem: Problem, resolved: Resolved, backward: list[str] | None) -> None:
    graph = problem.graph
    both = resolved.saved & resolved.recomputed
    if both:
        raise PlanInvariantError(f"values both saved and recomputed: {sorted(both)}")
    forced = resolved.recomputed & set(problem.constraints.must_save)
    if forced:
        raise PlanInvariantError(f"must-save values recomputed: {sorted(forced)}")
    order = backward_order(problem, resolved) if backward is None else backward
    twice = sorted(n for n, count in collections.Counter(order).items() if count > 1)
    if twice:
        raise PlanInvariantError(f"recomputed twice in the backward schedule: {twice}")
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
            raise PlanInvariantError(
                f"backward node {name} ({graph[name].op}) reads {inp}, which is neither "
                "saved, recomputed earlier, nor an input"
            )
        available.add(name)


def _check_decisions(plan, problem: Problem, resolved: Resolved) -> None:
    names = [d.name for d in plan.decisions]
    repeated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
    if repeated:
        raise PlanInvariantError(f"more than one decision for {repeated}")
    replay = problem.constraints.replay
    states = {f"{r}_rng_state": r for r in resolved.recomputed if r in replay}
    saved_owners = problem.saved_owners(resolved)
    moves = resolved.moves
    expected_by_action: dict[Action, set[str]] = {Action(action): set() for action in MOVES}
    expected_by_action[Action.SAVE] = set(saved_owners - moves.keys())
    for name, move in moves.items():
        expected_by_action[Action(move.action)].add(name)
    for d in plan.decisions:
        if d.op == "rng state":
            if d.name not in states or d.nbytes != replay[states[d.name]]:
                raise PlanInvariantError(
                    f"decision {d.name} keeps a generator state, but the plan replays no random op with it"
                )
            continue
        expected = expected_by_action.get(d.action, resolved.recomputed)
        if d.name not in expected:
            raise PlanInvariantError(
                f"decision {d.name} ({d.op}) says {d.action.value}, but the plan does not {d.action.value} it"
            )
    missing_states = sorted(set(states) - set(names))
    if missing_states:
        raise PlanInvariantError(f"random ops replayed without a generator-state decision: {missing_states}")
    graph = problem.graph
    listed = set(names)
    for name in sorted(saved_owners | resolved.recomputed, key=lambda n: graph[n].index):
        v = graph[name]
        if (v.is_tensor or v.is_multi) and graph[v.storage].role is Role.FORWARD and name not in listed:
            raise PlanInvariantError(
                f"{name} ({v.op}) is {'saved' if name in resolved.saved else 'recomputed'} but has no decision"
            )


def _check_figures(plan, problem: Problem, resolved: Resolved) -> None:
    fresh = simulate(problem, resolved)
    for figure in ("saved_bytes", "peak_bytes"):
        if getattr(plan, figure) != getattr(fresh, figure):
            raise PlanInvariantError(
                f"plan.{figure}={getattr(plan, figure)}, but simulating the plan gives {getattr(fresh, figure)}"
            )
    if plan.timeline.steps != fresh.steps or plan.timeline.live != fresh.live:
        raise PlanInvariantError("the plan's timeline is not the simulated schedule of its saved/recomputed sets")
    saved = sum(d.kept for d in plan.decisions)
    if saved != plan.saved_bytes:
        raise PlanInvariantError(f"plan.saved_bytes={plan.saved_bytes}, but its saved decisions add up to {saved}")
    flops = sum(problem.costs[n] for n in resolved.recomputed)
    if plan.recompute_flops != flops:
        raise PlanInvariantError(f"plan.recompute_flops={plan.recompute_flops}, but its recomputed values cost {flops}")
    if plan.budget_bytes is not None and plan.feasible != (plan.peak_bytes <= plan.budget_bytes):
        raise PlanInvariantError(
            f"plan.feasible={plan.feasible} with peak {plan.peak_bytes} and budget {plan.budget_bytes}"
        )
