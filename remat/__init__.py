"""remat: fit a training step's activation memory into a budget you state in bytes.

torch.compile(model, backend="remat", options={"memory_budget": "6GiB"})
"""

from .annotate import Action, NodeInfo
from .backend import compile, last_graphs, last_plan, recent_plans, remat_backend
from .compare import SolverComparison, compare_solvers
from . import checkpointing
from .eager.wrappers import (
    apply_activation_checkpointing,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
    set_activation_checkpointing,
)
from .config import RematConfig
from .explain import explain
from .measure import peak_memory
from .pareto import ParetoResult, pareto, torch_budget_points
from .plots import plot_pareto, plot_timeline
from .plan.check import PlanInvariantError, check_plan
from .plan.plan import Baseline, Decision, Plan
from .plan.solve import BudgetError
from .runtime.identity import PartitionMismatch
from .sizing import BatchFit, max_batch

__all__ = [
    "Action",
    "BatchFit",
    "Baseline",
    "BudgetError",
    "Decision",
    "NodeInfo",
    "ParetoResult",
    "PartitionMismatch",
    "Plan",
    "PlanInvariantError",
    "RematConfig",
    "SolverComparison",
    "check_plan",
    "compare_solvers",
    "compile",
    "explain",
    "last_graphs",
    "last_plan",
    "max_batch",
    "pareto",
    "peak_memory",
    "plot_pareto",
    "plot_timeline",
    "recent_plans",
    "remat_backend",
    "torch_budget_points",
]

__all__ += [
    "apply_activation_checkpointing",
    "checkpoint",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "checkpointing",
    "set_activation_checkpointing",
]
