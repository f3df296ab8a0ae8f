"""What remat decided, told without code: each compiled plan's one-line summary on the `remat` logger (INFO), and
the full plan as a `remat_plan` artifact in torch's structured trace (`TORCH_TRACE=<dir>`, read with tlparse)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING

from . import _torch
from .report import records

if TYPE_CHECKING:
    from .plan.plan import Plan

LOGGER = logging.getLogger("remat")
LOGGER.addHandler(logging.NullHandler())  # a library logs; the application decides where it goes
ARTIFACT = "remat_plan"  # the artifact's name in the trace


def plan_payload(plan: Plan, compile_id: str = "") -> dict:
    """The plan as plain JSON values: its figures, the summary and one record per decision."""
    return {
        "compile_id": compile_id,
        "summary": plan.summary(),
        "budget_bytes": _int_or_none(plan.budget_bytes),
        "peak_bytes": int(plan.peak_bytes),
        "saved_bytes": int(plan.saved_bytes),
        "recompute_flops": int(plan.recompute_flops),
        "least_peak_bytes": _int_or_none(plan.least_peak_bytes),
        "feasible": plan.feasible,
        "solver": plan.solver,
        "baseline": {
            "kind": plan.baseline.kind,
            "saved_bytes": int(plan.baseline.saved_bytes),
            "peak_bytes": int(plan.baseline.peak_bytes),
        },
        "notes": list(plan.notes),
        # a byte budget for the step split over its graphs (remat/step.py); None when planned alone
        "step_share": dataclasses.asdict(plan.step_share) if plan.step_share is not None else None,
        "decisions": records(plan),
    }


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


def log_plan(plan: Plan) -> None:
    """Log `plan`, made for the graph being compiled now: its summary at INFO, the whole plan as a trace artifact."""
    compile_id = _torch.current_compile_id()
    where = f" [{compile_id}]" if compile_id else ""
    LOGGER.info("plan%s: %s", where, plan.summary())
    # Built only when a trace is being written: a plan of a large model has thousands of decisions.
    _torch.trace_artifact(ARTIFACT, lambda: json.dumps(plan_payload(plan, compile_id), indent=1))
