"""remat's `apply_activation_checkpointing(model, variant, layers_fqn, ac_freq=..., save_ops=...)` against the
behaviours modalities' own tests pin (`tests/training/test_activation_checkpointing.py`), on a 4-block GPT
(remat.zoo, dropout on) on CPU.

Covered:
- "full": every block of the layer list (`blocks.0` ... `blocks.3`) is checkpointed and no other module;
- "selective_layer" with ac_freq=2: `blocks.1` and `blocks.3` only;
- "selective_op": every block, and — the op-level check modalities leaves open — the saved ops' outputs are not
  recomputed: no matmul runs in a selective-op recomputation, while a full recomputation runs them; the save
  list given with modalities' keys ("ops.aten.mm.default");
- end to end: the loss and every parameter's gradient of the plain model and of the three variants are equal —
  bitwise here, where modalities allows a tolerance — with dropout active;
- each checkpointed block runs its forward twice per step (forward, one recomputation), the others once;
- modalities' wrapped modules are renamed (`..._checkpoint_wrapped_module`) and are `CheckpointWrapper`s; remat
  wraps in place on purpose, so the module names, parameter names and state_dict keys stay the plain model's.

Not applicable:
- the FSDP1 / FSDP1-legacy / FSDP2 cases: they need two GPUs with NCCL and FSDP's own wrapping (the names with the
  `_fsdp_wrapped_module` prefix);
- building the models from modalities' YAML configs (its component registry): a modalities feature, not part of
  the checkpointing call.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import remat
from remat.eager import region
from remat.eager.wrappers import CheckpointedForward
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

CONFIG = GPTConfig(vocab=128, n_layer=4, d_model=64, n_head=4, seq_len=32, dropout=0.1)
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
VARIANTS = {
    "full": dict(variant="full"),
    "selective_layer": dict(variant="selective_layer", ac_freq=2),
    "selective_op": dict(
        variant="selective_op", save_ops=["ops.aten.mm.default", "ops.aten.addmm.default", "ops.aten.bmm.default"]
    ),
}
CHECKPOINTED = {"full": [0, 1, 2, 3], "selective_layer": [1, 3], "selective_op": [0, 1, 2, 3]}


@pytest.fixture(scope="module")
def base():
    return GPT(CONFIG, seed=0)


@pytest.fixture(scope="module")
def batch():
    return make_gpt_batch(CONFIG, batch=2, seed=1)


def _checkpointed(model):
    return [name for name, m in model.named_modules() if isinstance(m.__dict__.get("forward"), CheckpointedForward)]


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(42)
    loss = gpt_loss(model, *batch)
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_which_modules_are_checkpointed_and_names_stay(base, name):
    model = copy.deepcopy(base)
    assert remat.apply_activation_checkpointing(model, layers_fqn="blocks", **VARIANTS[name]) is model
    assert _checkpointed(model) == [f"blocks.{i}" for i in CHECKPOINTED[name]]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in base.named_modules()]
    assert list(model.state_dict()) == list(base.state_dict())
    assert all(type(a) is type(b) for a, b in zip(model.modules(), base.modules()))


def test_end_to_end_loss_and_gradients_equal_the_plain_model(base, batch):
    want = _step(copy.deepcopy(base), batch)
    for name, arguments in VARIANTS.items():
        model = copy.deepcopy(base)
        remat.apply_activation_checkpointing(model, layers_fqn="blocks", **arguments)
        got = _step(model, batch)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), f"{name}: tensor {i} differs by {(g - w).abs().max()}"


class _MatmulCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in MATMULS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_block_runs_and_matmuls_in_recomputation(base, batch, monkeypatch, name):
    model = copy.deepcopy(base)
    remat.apply_activation_checkpointing(model, layers_fqn="blocks", **VARIANTS[name])
    runs = [0] * CONFIG.n_layer
    for i, block in enumerate(model.blocks):  # the block's first layer: the recomputation calls it again
        block.ln1.register_forward_hook(lambda *_, i=i: runs.__setitem__(i, runs[i] + 1))
    matmuls = []
    original = region.Region.recompute

    def counting(self):
        with _MatmulCounter() as counter:
            original(self)
        matmuls.append(counter.calls)

    monkeypatch.setattr(region.Region, "recompute", counting)
    _step(model, batch)
    assert runs == [2 if i in CHECKPOINTED[name] else 1 for i in range(CONFIG.n_layer)]
    assert len(matmuls) == len(CHECKPOINTED[name])
    if name == "selective_op":
        assert matmuls == [0] * 4, "saved matmul outputs are handed back, not recomputed"
    else:
        assert all(count >= 4 for count in matmuls), matmuls  # attention projections and the MLP


def test_selective_layer_needs_ac_freq_and_an_nn_module_list(base):
    model = copy.deepcopy(base)
    with pytest.raises(ValueError, match="ac_freq"):
        remat.apply_activation_checkpointing(model, "selective_layer", "blocks")
    with pytest.raises(TypeError, match="nn.ModuleList"):
        remat.apply_activation_checkpointing(model, "full", "blocks.0")
    assert _checkpointed(model) == []
    assert isinstance(model.blocks, nn.ModuleList)
