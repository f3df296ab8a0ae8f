"""Plan invariant checks (debug=True) accept real plans and catch broken ones."""
import dataclasses

import pytest

import remat
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan.check import PlanInvariantError, check_plan

from graphs import CosMM, cosmm_input


@pytest.fixture(scope="module")
def planned():
    (c,) = capture_joints(CosMM(), cosmm_input())
    return plan_joint(c.joint, c.num_fwd_outputs, RematConfig(memory_budget=0.5, debug=True))


def test_real_plans_pass(planned):
    check_plan(planned.problem, planned.resolved)


def test_missing_saved_value_is_caught(planned):
    victim = sorted(planned.resolved.saved)[0]
    broken = dataclasses.replace(planned.resolved, saved=planned.resolved.saved - {victim})
    with pytest.raises(PlanInvariantError, match=f"reads {victim}"):
        check_plan(planned.problem, broken)


def test_saved_and_recomputed_is_caught(planned):
    victim = sorted(planned.resolved.saved)[0]
    broken = dataclasses.replace(planned.resolved, recomputed=planned.resolved.recomputed | {victim})
    with pytest.raises(PlanInvariantError, match="both saved and recomputed"):
        check_plan(planned.problem, broken)


def test_partition_without_process_group_is_a_clear_error():
    with pytest.raises(RuntimeError, match="partition='world': torch.distributed is not initialized"):
        remat.compile(CosMM(), partition="world")
    with pytest.raises(RuntimeError, match="init_process_group"):
        remat.explain(CosMM(), cosmm_input(), partition="world")
