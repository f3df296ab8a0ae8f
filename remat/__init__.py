"""remat: fit a training step's activation memory into a budget you state in bytes.

    torch.compile(model, backend="remat", options={"memory_budget": "6GiB"})
"""
from .annotate import Action, NodeInfo
from .backend import compile, last_plan, recent_plans, remat_backend
from .config import RematConfig
from .explain import explain
from .measure import peak_memory
from .plan.plan import Baseline, Decision, Plan
from .plan.solve import BudgetError

__all__ = [
    "Action", "Baseline", "BudgetError", "Decision", "NodeInfo", "Plan", "RematConfig",
    "compile", "explain", "last_plan", "peak_memory", "recent_plans", "remat_backend",
]
