"""capture → cost → annotate → plan for one joint graph: the part of the pipeline shared by the backend and explain."""
from __future__ import annotations

import dataclasses

import torch.fx as fx

from .annotate import annotate
from .capture import capture
from .config import RematConfig
from .cost import costs
from .plan.plan import Plan
from .plan.problem import Problem, Resolved, build_problem
from .plan.solve import make_plan


@dataclasses.dataclass(frozen=True)
class Planned:
    plan: Plan
    problem: Problem
    resolved: Resolved


def plan_joint(joint: fx.GraphModule, num_fwd_outputs: int, config: RematConfig) -> Planned:
    graph = capture(joint, num_fwd_outputs)
    table = costs(joint, graph)
    constraints = annotate(joint, graph, table, config.save_op_targets(), config.policy)
    problem = build_problem(graph, table, constraints)
    budget = config.budget_bytes() if config.budget_kind() == "bytes" else config.budget_fraction()
    plan = make_plan(problem, config.budget_kind(), budget, config.solver, config.strict, config.solver_time_limit)
    return Planned(plan, problem, problem.resolve(plan.recomputed))
