"""Gradients equal those of the uncompiled model: bitwise with aot_eager on CPU fp32, dropout included."""

import copy

import pytest
import torch

import remat
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

CONFIG = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.1)
BUDGETS = [None, 1.0, 0.75, 0.5, 0.25, 0.0, "700KB", 400_000, "10MB"]


class Loss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return gpt_loss(self.model, idx, targets)


def step(module, batch, seed=1234):
    torch.manual_seed(seed)
    loss = module(*batch)
    loss.backward()
    after = torch.rand(4)  # the RNG state after the step must match too
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    return loss.detach(), grads, after


@pytest.fixture(scope="module")
def reference():
    model = Loss(GPT(CONFIG))
    batch = make_gpt_batch(CONFIG, batch=2)
    return model, batch, step(copy.deepcopy(model), batch)


@pytest.mark.parametrize("budget", BUDGETS, ids=str)
def test_gpt_with_dropout_bitwise_aot_eager(reference, budget):
    model, batch, (loss, grads, after) = reference
    compiled = torch.compile(
        copy.deepcopy(model), backend="remat", options={"memory_budget": budget, "inner": "aot_eager"}
    )
    got_loss, got_grads, got_after = step(compiled, batch)
    plan = remat.last_plan()
    assert torch.equal(got_loss, loss)
    for name, g in grads.items():
        assert torch.equal(got_grads["_orig_mod." + name], g), name
    assert torch.equal(got_after, after)
    if plan.budget_bytes is not None and plan.budget_bytes < plan.baseline.peak_bytes:
        assert plan.recompute_flops > 0  # the budget made it recompute something, and gradients still match


def test_gpt_budget_zero_replays_dropout_instead_of_saving_masks():
    # Masks here (64–256 KiB) are much larger than the 5 KiB CPU generator state a replay keeps.
    config = GPTConfig(vocab=128, n_layer=2, d_model=128, n_head=4, seq_len=128, dropout=0.1)
    model, batch = Loss(GPT(config)), make_gpt_batch(config, batch=4)
    replay = remat.explain(model, *batch, memory_budget=0.0, inner="aot_eager")
    keep = remat.explain(model, *batch, memory_budget=0.0, rng="save", inner="aot_eager")
    saved_masks = [d for d in replay.decisions if d.dtype == "bool" and d.action is remat.Action.SAVE]
    kept_masks = [d for d in keep.decisions if d.dtype == "bool" and d.action is remat.Action.SAVE]
    assert len(saved_masks) < len(kept_masks) == 6  # 2 layers x (attention, residual, mlp) dropout
    assert any(d.op == "rng state" for d in replay.decisions)
    assert replay.peak_bytes < keep.peak_bytes < keep.baseline.peak_bytes


@pytest.mark.inductor
@pytest.mark.parametrize("budget", [None, 0.5, 0.0], ids=str)
def test_gpt_with_dropout_inductor(reference, budget):
    model, batch, _ = reference
    # inductor draws its own random numbers unless told to fall back to eager's generator
    with torch._inductor.config.patch(fallback_random=True):
        loss, grads, _ = step(copy.deepcopy(model), batch)
        compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"memory_budget": budget})
        got_loss, got_grads, _ = step(compiled, batch)
    torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-7)
    for name, g in grads.items():
        torch.testing.assert_close(got_grads["_orig_mod." + name], g, rtol=1e-5, atol=1e-7)
