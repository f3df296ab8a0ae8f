"""Under inductor (whose min-cut partition may save them), a value the joint graph traces in its backward part but
computes from forward values alone (cos's derivative sin(x)) runs in the forward as soon as its inputs exist when the
plan saves it, so the values it reads are released where they would be without it — in the schedule the simulation
scores and in the forward module that runs."""

from __future__ import annotations

import dataclasses

import torch

from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan.arrays import BACKWARD
from remat.plan.schedule import forward_order
from remat.plan.simulate import simulate
from remat.rewrite.split import split

from graphs import MIB, CosMM, cosmm_input


def _sin_saved(depth=3):
    model, x = CosMM(depth), cosmm_input().requires_grad_()
    captured = capture_joints(model, x, inner="inductor")[0]
    planned = plan_joint(captured.joint, captured.num_fwd_outputs, RematConfig(inner="inductor"))
    problem = planned.problem
    a = problem.arrays
    boundary = a.role.index(BACKWARD)
    sins = [v.name for v in problem.graph.values if v.op == "aten.sin.default"]
    assert len(sins) == depth + 1 and all(a.index[s] > boundary for s in sins)  # traced in the backward part
    # save each mm's input (cos_k) and sin of each cos input instead of the mm outputs
    saved = {
        v.name
        for v in problem.graph.values
        if v.op == "aten.cos.default" and v.users and any(problem.graph[u].op == "aten.mm.default" for u in v.users)
    } | set(sins)
    return model, x, captured, problem, problem.resolve_saved(saved), sins


def test_a_saved_backward_part_value_runs_right_after_its_input():
    _, _, _, problem, resolved, sins = _sin_saved()
    order = forward_order(problem, resolved)
    for s in sins:
        (source,) = problem.graph[s].inputs
        if source in order:  # sin(x) of the input x has nothing to wait for: it stays in place
            assert order.index(s) == order.index(source) + 1, order
    # op by op (aot_eager, eager) the joint graph's order stands: every sin after the forward's last op
    unfused = forward_order(dataclasses.replace(problem, fuses=False), resolved)
    assert unfused[-len(sins) :] == sins, unfused
    assert simulate(problem, resolved).saved_bytes == 7 * MIB


def test_the_forward_module_runs_that_order_with_unchanged_gradients():
    model, x, captured, problem, resolved, sins = _sin_saved()
    fw, bw = split(captured.joint, problem, resolved, captured.num_fwd_outputs)
    names = [n.name for n in fw.graph.nodes]
    for s in sins:
        (source,) = problem.graph[s].inputs
        if not source.startswith("primals"):
            assert names.index(s) == names.index(source) + 1, names
    primals = [x, *model.parameters()]  # the joint graph's primals: the input, then the weights
    outs = fw(*[p.detach() for p in primals])
    grads = bw(*outs[1:], torch.ones_like(outs[0]))
    reference = torch.autograd.grad(model(x), primals)
    assert all(torch.equal(g, r) for g, r in zip(grads, reference))
