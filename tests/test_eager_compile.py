"""The eager checkpointing APIs inside torch.compile(backend="remat"): no graph break at region boundaries, and
the marked regions become planner constraints (recompute inside, unless a memory budget is given)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import remat
from remat import checkpointing
from remat.annotate import Action
from remat.capture import capture
from remat.explain import capture_joints
from remat.regions import checkpoint_regions, region_count
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from eager_models import assert_bitwise, grads

OPTIONS = {"inner": "aot_eager"}


class Block(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Net(nn.Module):
    """Three blocks; `mode` picks how they are checkpointed inside forward."""

    def __init__(self, mode="none"):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.mode = mode

    def forward(self, x):
        for block in self.blocks:
            if self.mode == "checkpoint":
                x = remat.checkpoint(block, x)
            elif self.mode == "deepspeed":
                x = checkpointing.checkpoint(block, x)
            else:
                x = block(x)
        return x.square().mean()


def _wrapped(api):
    if api in ("checkpoint", "deepspeed"):
        return Net(api)
    model = Net()
    if api == "checkpoint_wrapper":
        for block in model.blocks:
            remat.checkpoint_wrapper(block)
    elif api == "apply_activation_checkpointing":
        remat.apply_activation_checkpointing(model, "full", "blocks")
    elif api == "set_activation_checkpointing":
        seq = nn.Sequential(*model.blocks)
        remat.set_activation_checkpointing(seq, strategy="each")
        model.blocks = nn.ModuleList([seq])
    return model


def _train_step(model, x):
    model.zero_grad()
    loss = model(x)
    loss.backward()
    return [loss.detach()] + grads(model)


def _region_reasons(plan):
    return [d.reason for d in plan.decisions if d.reason.startswith("checkpoint region")]


@pytest.mark.parametrize(
    "api",
    ["checkpoint", "deepspeed", "checkpoint_wrapper", "apply_activation_checkpointing", "set_activation_checkpointing"],
)
def test_regions_compile_without_graph_break_and_are_recomputed(api):
    x = torch.randn(8, 32)
    want = _train_step(Net(), x)
    model = _wrapped(api)
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="remat", options=OPTIONS, fullgraph=True)
    got = _train_step(compiled, x)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert_bitwise(got, want)
    plan = remat.last_plan()
    recomputed = [d for d in plan.decisions if d.action is Action.RECOMPUTE and d.reason.endswith(": recompute")]
    # Each block's addmm and tanh are recomputed in backward; block outputs read by the next block are saved.
    assert sorted({d.reason for d in recomputed}) == [f"checkpoint region {i}: recompute" for i in range(3)]
    assert sum(d.op == "aten.tanh.default" for d in recomputed) == 3
    saved = [d for d in plan.decisions if d.action is Action.SAVE and "output, read region" in d.reason]
    assert [d.reason for d in saved] == [
        "checkpoint region 0: output, read region 1",
        "checkpoint region 1: output, read region 2",
    ]
    assert plan.saved_bytes < _unwrapped_plan(x).saved_bytes


def _unwrapped_plan(x):
    torch.compile(Net(), backend="remat", options=OPTIONS)(x).backward()
    plan = remat.last_plan()
    assert not _region_reasons(plan)
    assert all(d.nbytes == 0 for d in plan.decisions if d.action is Action.RECOMPUTE)  # views only
    return plan


def test_selective_op_saves_matmuls_in_the_plan():
    x = torch.randn(8, 32)
    want = _train_step(Net(), x)
    model = Net()
    remat.apply_activation_checkpointing(model, "selective_op", "blocks", save_ops=["aten.addmm"])
    got = _train_step(torch.compile(model, backend="remat", options=OPTIONS, fullgraph=True), x)
    assert_bitwise(got, want)
    plan = remat.last_plan()
    by_op = {}
    for d in plan.decisions:
        if d.reason.startswith("checkpoint region"):
            by_op.setdefault(d.op, set()).add(d.action)
    assert by_op["aten.addmm.default"] == {Action.SAVE}
    assert by_op["aten.tanh.default"] == {Action.RECOMPUTE}


def test_memory_budget_wins_over_regions_and_the_plan_says_so():
    x = torch.randn(8, 32)
    compiled = torch.compile(Net("checkpoint"), backend="remat", options={**OPTIONS, "memory_budget": 1.0})
    compiled(x).backward()
    plan = remat.last_plan()
    assert not _region_reasons(plan)
    assert plan.notes == ("3 checkpoint region(s) marked in the model were not imposed: memory_budget decides",)
    torch.compile(Net("checkpoint"), backend="remat", options=OPTIONS)(x).backward()
    assert remat.last_plan().notes == ()


def test_checkpoint_regions_is_pure_and_deterministic():
    (captured,) = capture_joints(Net("checkpoint"), torch.randn(8, 32))
    before = captured.joint.code
    graph = capture(captured.joint, captured.num_fwd_outputs)
    first = checkpoint_regions(captured.joint, graph)
    second = checkpoint_regions(captured.joint, graph)
    assert captured.joint.code == before
    assert dict(first.must_recompute) == dict(second.must_recompute) and first.count == 3
    assert region_count(captured.joint) == 3
    assert not set(first.must_save) & set(first.must_recompute)
    assert sorted(first.must_save.values()) == [
        "checkpoint region 0: output, read region 1",
        "checkpoint region 1: output, read region 2",
        "checkpoint region 2: output, read outside the region",
    ]
    assert all(graph[name].module_path.startswith("blocks.") for name in first.must_recompute)


def test_unmarked_model_has_no_regions():
    (captured,) = capture_joints(Net(), torch.randn(8, 32))
    graph = capture(captured.joint, captured.num_fwd_outputs)
    regions = checkpoint_regions(captured.joint, graph)
    assert regions.count == 0 and not regions.must_save and not regions.must_recompute


@pytest.mark.parametrize("variant, ac_freq, regions", [("full", None, 2), ("selective_layer", 2, 1)])
def test_gpt_with_dropout_compiled_gradients_equal(variant, ac_freq, regions):
    config = GPTConfig(n_layer=2, d_model=64, n_head=2, seq_len=32, vocab=128, dropout=0.1)
    idx, targets = make_gpt_batch(config, batch=2)
    raw = GPT(config)
    model = copy.deepcopy(raw)
    remat.apply_activation_checkpointing(model, variant, "blocks", ac_freq=ac_freq)
    results = []
    for m, compiled in ((raw, False), (model, True)):
        step = torch.compile(gpt_loss, backend="remat", options=OPTIONS, fullgraph=True) if compiled else gpt_loss
        torch.manual_seed(11)
        loss = step(m, idx, targets)
        loss.backward()
        results.append([loss.detach()] + grads(m))
    assert_bitwise(results[1], results[0])
    reasons = {r.split(":")[0] for r in _region_reasons(remat.last_plan())}
    assert reasons == {f"checkpoint region {i}" for i in range(regions)}


@pytest.mark.inductor
def test_regions_under_inductor():
    x = torch.randn(8, 32)
    want = _train_step(Net(), x)
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(Net("checkpoint"), backend="remat", fullgraph=True)
    got = _train_step(compiled, x)
    assert not torch._dynamo.utils.counters["graph_break"]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert sorted({r for r in _region_reasons(remat.last_plan()) if r.endswith(": recompute")}) == [
        f"checkpoint region {i}: recompute" for i in range(3)
    ]
