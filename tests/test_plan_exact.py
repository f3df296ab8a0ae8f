"""Exact plans on cos → 5 × (mm 512² → cos): every activation is 1 MiB, so bytes and counts are integers."""

import copy

import pytest
import torch
from torch._functorch.partitioners import default_partition

import remat
from remat.capture import Role, capture
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan.simulate import simulate

from graphs import MIB, CosMM, cosmm_input

COS = 2 * MIB * 10  # a 1 MiB pointwise op moves 2 MiB, at cost.FLOPS_PER_BYTE = 10
MM = 2 * 512**3
LOSS = 4  # the fp32 scalar loss is live to the end of the step


@pytest.fixture(scope="module")
def joint():
    (captured,) = capture_joints(CosMM(), cosmm_input())
    return captured


def plan(joint, **fields):
    return plan_joint(joint.joint, joint.num_fwd_outputs, RematConfig(**fields)).plan


def counts(p):
    ops = [d.op for d in p.decisions if d.action is remat.Action.RECOMPUTE]
    return ops.count("aten.cos.default"), ops.count("aten.mm.default")


def test_no_budget_saves_what_the_default_partition_saves(joint):
    gm = copy.deepcopy(joint.joint)
    fw, _ = default_partition(gm, None, num_fwd_outputs=joint.num_fwd_outputs)
    outputs = list(fw.graph.find_nodes(op="output"))[0].args[0][joint.num_fwd_outputs :]
    graph = capture(joint.joint, joint.num_fwd_outputs)
    default_storages = {graph[n.name].storage for n in outputs if graph[graph[n.name].storage].role is Role.FORWARD}
    p = plan(joint, memory_budget=None, inner="eager")  # plain eager autograd: no partitioner
    assert p.baseline.kind == "default partition"
    assert {graph[n].storage for n in p.saved} == default_storages
    assert p.saved_bytes == 10 * MIB == sum(graph[s].nbytes for s in default_storages)


def planned_against_min_cut(joint, inner):
    """remat's None plan under `inner`, after checking it saves what torch's min-cut partitioner saves."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    gm = copy.deepcopy(joint.joint)
    fw, _ = min_cut_rematerialization_partition(gm, None, num_fwd_outputs=joint.num_fwd_outputs)
    outputs = list(fw.graph.find_nodes(op="output"))[0].args[0][joint.num_fwd_outputs :]
    planned = plan_joint(copy.deepcopy(joint.joint), joint.num_fwd_outputs, RematConfig(inner=inner))
    assert planned.plan.baseline.kind == f"{inner} min-cut partition"
    assert planned.resolved.saved | planned.resolved.inputs == {n.name for n in outputs}
    assert planned.inner_modules is not None
    return planned.plan


def test_no_budget_under_aot_eager_saves_what_min_cut_saves(joint):
    """Plain torch.compile(backend="aot_eager") partitions with the min-cut partitioner too: remat's None plan under
    aot_eager is that partition, and runs its modules."""
    p = planned_against_min_cut(joint, "aot_eager")
    assert p.saved_bytes == 10 * MIB == p.baseline.saved_bytes
    assert {d.op for d in p.decisions if d.action is remat.Action.RECOMPUTE} == {"aten.sin.default", "aten.neg.default"}
    assert p.peak_bytes == p.baseline.peak_bytes == 11 * MIB + LOSS


def test_no_budget_under_inductor_saves_what_min_cut_saves(joint):
    p = planned_against_min_cut(joint, "inductor")
    # min-cut keeps each mm output (for sin in backward) and each cos output through its transpose (for the weight
    # gradient): 10 values of 1 MiB, as the default partition; the backward-traced sin and neg stay in backward.
    assert p.saved_bytes == 10 * MIB == p.baseline.saved_bytes
    assert sum(d.kept for d in p.decisions) == 10 * MIB
    assert counts(p) == (0, 0)
    assert {d.op for d in p.decisions if d.action is remat.Action.RECOMPUTE} == {"aten.sin.default", "aten.neg.default"}
    assert p.budget_bytes is None and p.peak_bytes == p.baseline.peak_bytes
    # backward's first loop writes the last cos's gradient in place over the saved mm output it reads last
    assert p.peak_bytes == p.baseline.peak_bytes == 10 * MIB + LOSS
    assert p.recompute_flops == 0 and counts(p) == (0, 0)


# budget (MiB, plus slack for the loss scalar) → saved MiB, peak MiB, recomputed cos, recomputed mm (inductor: the
# peak is the saved bytes, backward's loops writing their gradients in place over what they read last)
SWEEP = [
    (12, 10, 10, 0, 0),
    (11, 10, 10, 0, 0),
    (10, 10, 10, 0, 0),
    (9, 9, 9, 1, 0),
    (8, 8, 8, 2, 0),
    (7, 7, 7, 3, 0),
    (6, 6, 6, 4, 0),
    (5, 4, 5, 5, 1),
]


@pytest.mark.parametrize("budget,saved,peak,cos,mm", SWEEP)
def test_byte_budget_sweep_is_exact(joint, budget, saved, peak, cos, mm):
    p = plan(joint, memory_budget=budget * MIB + 16)
    assert p.saved_bytes == saved * MIB
    assert p.peak_bytes == peak * MIB + LOSS
    assert counts(p) == (cos, mm)
    assert p.recompute_flops == cos * COS + mm * MM


def test_sweep_is_monotone(joint):
    plans = [plan(joint, memory_budget=b * MIB + 16) for b, *_ in SWEEP]
    saved = [p.saved_bytes for p in plans]
    flops = [p.recompute_flops for p in plans]
    assert saved == sorted(saved, reverse=True)
    assert flops == sorted(flops)


def test_save_ops_keeps_every_mm_output(joint):
    p = plan(joint, memory_budget=0.0, save_ops=["aten.mm"])
    mm_saved = [d for d in p.decisions if d.op == "aten.mm.default"]
    assert len(mm_saved) == 5 and all(d.action is remat.Action.SAVE for d in mm_saved)
    assert all(d.reason == "save_ops: aten.mm.default" for d in mm_saved)
    # the first four mm inputs are recomputed instead; recomputing the last cos too would leave the least peak at
    # 6 MiB, so it stays saved
    assert counts(p) == (4, 0)
    assert p.saved_bytes == 6 * MIB and p.peak_bytes == p.least_peak_bytes == 6 * MIB + LOSS


def test_zero_budget_is_no_worse_than_recomputing_everything(joint):
    planned = plan_joint(joint.joint, joint.num_fwd_outputs, RematConfig(memory_budget=0.0))
    problem = planned.problem
    everything = simulate(problem, problem.resolve(problem.choosable))
    assert planned.plan.peak_bytes <= everything.peak_bytes
    assert planned.plan.peak_bytes == planned.plan.least_peak_bytes == 5 * MIB + LOSS


def test_measured_peak_matches_simulation_with_aot_eager():
    model, x = CosMM(), cosmm_input()
    for budget in (None, 8 * MIB + 16, 0.0):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="remat", options={"memory_budget": budget, "inner": "aot_eager"})
        compiled(x).backward()
        p = remat.last_plan()

        def step():
            for w in model.parameters():
                w.grad = None
            compiled(x).backward()

        step()
        for w in model.parameters():
            w.grad = None
        measured = remat.peak_memory(step, exclude=lambda: [w.grad for w in model.parameters()])
        # the backward's one-element tangent and a few bytes of bookkeeping are all that differ
        assert p.peak_bytes <= measured <= p.peak_bytes + 64


# contiguous=True: (budget, saved MiB, peak MiB, recomputed cos, recomputed mm). Saved values live in an arena the
# pool holds for the whole step, each copied there as it is computed (its own 1 MiB freed at once): the arena never
# shrinks in backward, so keeping all 10 values peaks at 12 MiB: the arena, and the last layer's sin and neg, which
# aot_eager's min-cut partition (the baseline) computes in backward.
CONTIGUOUS = [
    (None, 10, 12, 0, 0),
    (11 * MIB + 16, 8, 11, 2, 0),
    (10 * MIB + 16, 7, 10, 3, 0),
    (9 * MIB + 16, 6, 9, 4, 0),
]


@pytest.mark.parametrize("budget,saved,peak,cos,mm", CONTIGUOUS)
def test_contiguous_arena_is_simulated_for_the_whole_step(joint, budget, saved, peak, cos, mm):
    p = plan(joint, memory_budget=budget, contiguous=True, inner="aot_eager")
    assert p.saved_bytes == saved * MIB
    assert p.peak_bytes == peak * MIB + LOSS
    assert counts(p) == (cos, mm)
    assert set(p.timeline.live_at_peak()) == {d.name for d in p.decisions if d.action is remat.Action.SAVE}


def test_contiguous_measured_peak_matches_simulation_with_aot_eager():
    from remat.runtime.buffers import POOL

    model, x = CosMM(), cosmm_input()
    for budget, _, peak, _, _ in CONTIGUOUS:
        torch._dynamo.reset()
        POOL.clear()
        options = {"memory_budget": budget, "inner": "aot_eager", "contiguous": True}
        compiled = torch.compile(model, backend="remat", options=options)

        def step():
            for w in model.parameters():
                w.grad = None
            compiled(x).backward()

        step()  # the pool learns the arena's size
        step()  # and allocates it
        measured = remat.peak_memory(step, exclude=lambda: [w.grad for w in model.parameters()])
        assert remat.last_plan().peak_bytes == peak * MIB + LOSS
        assert peak * MIB + LOSS <= measured <= peak * MIB + LOSS + 64, budget
        assert POOL.stats.allocations == 1
    POOL.clear()
