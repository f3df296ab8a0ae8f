"""capture → cost → annotate → plan for one joint graph: the part of the pipeline shared by the backend and explain."""
from __future__ import annotations

import dataclasses

import torch.fx as fx

from .annotate import annotate
from .capture import capture
from .config import RematConfig
from .cost import costs
from .plan.check import check_plan
from .plan.plan import Plan
from .plan.problem import Problem, Resolved, build_problem
from .plan.solve import make_plan


@dataclasses.dataclass(frozen=True)
class Planned:
    plan: Plan
    problem: Problem
    resolved: Resolved


def refuse_unavailable(config: RematConfig) -> None:
    """Options that are validated but whose runtime is not in this version: refuse rather than ignore them."""
    for option, off in (("offload", False), ("partition", None), ("contiguous", False)):
        value = getattr(config, option)
        if value is not off:
            raise ValueError(f"{option}={value!r}: this version of remat plans save/recompute only; "
                             f"{option} is not available yet — leave it at {off!r}")


def plan_joint(joint: fx.GraphModule, num_fwd_outputs: int, config: RematConfig,
               hooked: frozenset[str] = frozenset()) -> Planned:
    """Plan one joint graph; `hooked` names the dynamo-graph nodes that carry tensor hooks (capture.hooked_nodes)."""
    refuse_unavailable(config)
    graph = capture(joint, num_fwd_outputs)
    table = costs(joint, graph)
    constraints = annotate(joint, graph, table, config.save_op_targets(), config.policy, hooked)
    problem = build_problem(graph, table, constraints)
    budget = config.budget_bytes() if config.budget_kind() == "bytes" else config.budget_fraction()
    plan = make_plan(problem, config.budget_kind(), budget, config.solver, config.strict, config.solver_time_limit)
    resolved = plan.resolved  # the sets the simulator scored are the sets the rewrite builds
    if config.debug:
        check_plan(plan)
    return Planned(plan, problem, resolved)
