"""Plan invariant checks (remat.check_plan, and debug=True) accept real plans and catch broken ones."""

import dataclasses

import pytest
import torch

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


# ---- remat.check_plan on the Plans users hold --------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan():
    """A CosMM plan that saves some values and recomputes others, with mm on the save-list (must-save)."""
    p = remat.explain(CosMM(), cosmm_input(), memory_budget=0.0, save_ops=["aten.mm"])
    assert p.saved and p.recomputed
    return p


def test_check_plan_is_public_and_accepts_real_plans(plan, monkeypatch):
    assert remat.check_plan is check_plan and remat.PlanInvariantError is PlanInvariantError
    remat.check_plan(plan)
    remat.check_plan(remat.explain(CosMM(), cosmm_input()))  # baseline
    monkeypatch.setattr("remat.backend._plans", [])
    torch.compile(CosMM(), backend="remat", options={"memory_budget": 0.5, "inner": "aot_eager"})(
        cosmm_input()
    ).backward()
    remat.check_plan(remat.last_plan())


def test_check_plan_on_dropout_plans():
    from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

    config = GPTConfig(vocab=64, n_layer=1, d_model=32, n_head=2, seq_len=16, dropout=0.1)
    model = GPT(config)
    for budget in (None, 0.5, 0.0):
        remat.check_plan(
            remat.explain(lambda i, t: gpt_loss(model, i, t), *make_gpt_batch(config, 2), memory_budget=budget)
        )


def broken(plan, **resolved_changes):
    return dataclasses.replace(plan, resolved=dataclasses.replace(plan.resolved, **resolved_changes))


def test_uncovered_backward_read_is_caught(plan):
    victim = sorted(plan.resolved.saved)[0]
    with pytest.raises(PlanInvariantError, match=f"reads {victim}, which is neither saved, recomputed earlier"):
        check_plan(broken(plan, saved=plan.resolved.saved - {victim}))


def test_saved_and_recomputed_plan_is_caught(plan):
    victim = sorted(plan.resolved.saved)[0]
    with pytest.raises(PlanInvariantError, match=f"both saved and recomputed: \\['{victim}'\\]"):
        check_plan(broken(plan, recomputed=plan.resolved.recomputed | {victim}))


def test_must_save_recomputed_is_caught(plan):
    mm = next(d.name for d in plan.decisions if d.op == "aten.mm.default")
    with pytest.raises(PlanInvariantError, match=f"must-save values recomputed: \\['{mm}'\\]"):
        check_plan(broken(plan, saved=plan.resolved.saved - {mm}, recomputed=plan.resolved.recomputed | {mm}))


def test_value_recomputed_twice_is_caught(plan):
    t = plan.timeline
    name = plan.recomputed[0]
    at = t.steps.index(name, t.num_forward)
    twice = t.step_ids[:at] + (t.step_ids[at],) + t.step_ids[at:]
    with pytest.raises(PlanInvariantError, match=f"recomputed twice in the backward schedule: \\['{name}'\\]"):
        check_plan(dataclasses.replace(plan, timeline=dataclasses.replace(t, step_ids=twice)))


@pytest.mark.parametrize("figure", ["saved_bytes", "peak_bytes"])
def test_figures_off_the_simulation_are_caught(plan, figure):
    wrong = getattr(plan, figure) + 1
    with pytest.raises(PlanInvariantError, match=f"plan.{figure}={wrong}, but simulating the plan gives"):
        check_plan(dataclasses.replace(plan, **{figure: wrong}))


def test_recompute_flops_off_is_caught(plan):
    with pytest.raises(
        PlanInvariantError, match=f"plan.recompute_flops=0, but its recomputed values cost {plan.recompute_flops}"
    ):
        check_plan(dataclasses.replace(plan, recompute_flops=0))


def test_decision_disagreeing_with_the_sets_is_caught(plan):
    i = next(i for i, d in enumerate(plan.decisions) if d.action is remat.Action.RECOMPUTE)
    flipped = dataclasses.replace(plan.decisions[i], action=remat.Action.SAVE)
    decisions = plan.decisions[:i] + (flipped,) + plan.decisions[i + 1 :]
    with pytest.raises(PlanInvariantError, match=f"decision {flipped.name} .* says save, but the plan does not save"):
        check_plan(dataclasses.replace(plan, decisions=decisions))
    with pytest.raises(PlanInvariantError, match=f"{flipped.name} .* is recomputed but has no decision"):
        check_plan(dataclasses.replace(plan, decisions=plan.decisions[:i] + plan.decisions[i + 1 :]))


def test_check_plan_needs_a_plan():
    with pytest.raises(TypeError, match="expected a remat.Plan made by remat"):
        check_plan(object())
