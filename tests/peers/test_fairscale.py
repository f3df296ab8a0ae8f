"""`remat.checkpoint_wrapper` against the behaviours FairScale's own tests of its `checkpoint_wrapper` pin
(`tests/nn/checkpoint/test_checkpoint_activations.py`, `test_checkpoint_activations_norm.py`), on CPU.

Covered:
- a feed-forward block with dropout (p=0.5) inside a model: loss and gradients (every parameter and the input,
  not only their norm) are the same without checkpointing, with torch's `checkpoint`, with the wrapper and with
  the wrapper offloading to host — bitwise, so the random state is saved and replayed;
- three stacked blocks, only the middle one offloading (`offload_to_cpu` given positionally): parity with the
  plain and the all-checkpointed model; the offloading block keeps a host copy of its input, the others the input
  itself;
- two conv branches, the second input passed by keyword to the outer model, one or two outputs, either branch
  or both checkpointed: parity;
- `checkpoint_wrapper(module, {})`, FairScale's old call form: the second argument is a truth value (an empty dict
  means no offload, a non-empty one offload);
- normalization layers (LayerNorm, BatchNorm2d) after a Linear, in fp32, with parameters and buffers set to fp16,
  and after `.half()`: the wrapped model loads the plain model's state_dict (same keys), and after a step of SGD
  both state_dicts — parameters and BatchNorm's running statistics — are equal. FairScale expects CPU fp16 to raise
  "not implemented for 'Half'"; that was a limit of torch's CPU kernels, which now run it, so the fp16 cases check
  parity like the others;
- the wrapped block runs its forward twice per step (forward and one recomputation).

Not applicable:
- the exact CUDA allocator figures (memory after forward, after backward, peak) of `test_basic` and
  `test_offload_memory`: they need CUDA and FairScale's own allocation pattern; remat's device-memory saving under
  offload is measured in tests/test_eager_checkpointing.py when CUDA is present;
- the `fairscale.nn.misc` import path: a FairScale module path, not a behaviour of the wrapper.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import remat
from remat.eager import region


@pytest.fixture(autouse=True)
def no_regions_left():
    """Regions an earlier test left (a traceback keeping one alive) must not be counted here."""
    gc.collect()


def _state(model, x, kwargs=None):
    """loss, input grad and every parameter's grad of one step."""
    x = x.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(11)
    out = model(x, **(kwargs or {}))
    if isinstance(out, tuple):
        out = torch.cat([o.flatten() for o in out])
    loss = out.sum()
    loss.backward()
    return [loss.detach(), x.grad] + [p.grad for p in model.parameters()]


def _equal(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"tensor {i}: max |diff| {(x - y).abs().max()}"


class FeedForwardModel(nn.Module):
    """A dropout FFN, run plainly, through torch's checkpoint, or wrapped by remat; then a Linear head."""

    def __init__(self, mode="plain", **wrapper_args):
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.ffn = nn.Sequential(nn.Linear(32, 128), nn.Dropout(p=0.5), nn.Linear(128, 32))
        if mode == "remat":
            remat.checkpoint_wrapper(self.ffn, **wrapper_args)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        if self.mode == "torch":
            x = torch.utils.checkpoint.checkpoint(self.ffn, x, use_reentrant=False)
        else:
            x = self.ffn(x)
        return self.out(x)


def test_dropout_block_same_loss_and_grads_plain_torch_wrapper_offload():
    x = torch.rand(2, 16, 32)
    plain = _state(FeedForwardModel(), x)
    for model in (FeedForwardModel("torch"), FeedForwardModel("remat"), FeedForwardModel("remat", offload_to_cpu=True)):
        _equal(_state(model, x), plain)
    without_dropout = FeedForwardModel()
    without_dropout.ffn[1].p = 0.0
    assert not torch.equal(_state(without_dropout, x)[0], plain[0]), "the dropout mask shapes the loss"


def _three_blocks(checkpoint=False, offload=False):
    torch.manual_seed(0)
    blocks = nn.Sequential(
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 8)),
        nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 4), nn.Linear(4, 4)),
        nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 8), nn.Linear(8, 2)),
    )
    if checkpoint:
        for i, block in enumerate(blocks):
            remat.checkpoint_wrapper(block, offload if i == 1 else False)  # positional offload_to_cpu
    return blocks


def test_only_the_middle_block_offloads():
    x = torch.rand(60, 24, 4)
    plain = _state(_three_blocks(), x)
    _equal(_state(_three_blocks(checkpoint=True), x), plain)
    model = _three_blocks(checkpoint=True, offload=True)
    _equal(_state(model, x), plain)
    inputs = []
    hooks = [b.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in model]
    out = model(x.clone().requires_grad_(True))
    for hook in hooks:
        hook.remove()
    kept = [r.stash.kept_tensors() for r in region.live_regions()]
    assert len(kept) == 3 and all(len(ts) == 1 for ts in kept)
    # the offloading block holds a copy of its input; the others hold their input itself
    copies = [ts[0] for ts in kept if not any(ts[0] is i for i in inputs)]
    assert len(copies) == 1 and torch.equal(copies[0], inputs[1])
    assert copies[0].untyped_storage().data_ptr() != inputs[1].untyped_storage().data_ptr()
    del kept, copies
    out.sum().backward()
    assert region.live_regions() == []


class TwoBranches(nn.Module):
    def __init__(self, two_outputs, wrapped):
        super().__init__()
        torch.manual_seed(0)
        self.two_outputs = two_outputs
        self.conv1 = nn.Sequential(nn.Conv2d(1, 5, 3), nn.ReLU(), nn.Conv2d(5, 5, 3))
        self.conv2 = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.Conv2d(5, 5, 3))
        if wrapped & 1:
            remat.checkpoint_wrapper(self.conv1)
        if wrapped & 2:
            remat.checkpoint_wrapper(self.conv2)

    def forward(self, x1, x2=None):
        a, b = self.conv1(x1), self.conv2(x2)
        return (a, b) if self.two_outputs else a + b


@pytest.mark.parametrize("wrapped", [1, 2, 3])
@pytest.mark.parametrize("two_outputs", [True, False])
def test_two_branches_second_input_by_keyword(two_outputs, wrapped):
    torch.manual_seed(4)
    x1, x2 = torch.rand(4, 1, 16, 16), torch.rand(4, 3, 16, 16).requires_grad_(True)
    want = _state(TwoBranches(two_outputs, 0), x1, {"x2": x2})
    want_x2 = x2.grad.clone()
    x2.grad = None
    got = _state(TwoBranches(two_outputs, wrapped), x1, {"x2": x2})
    _equal(got + [x2.grad], want + [want_x2])


@pytest.mark.parametrize("second, offloads", [({}, False), ({"offload": 1}, True)])
def test_second_positional_argument_is_a_truth_value(second, offloads):
    torch.manual_seed(0)
    ffn = nn.Sequential(nn.Linear(32, 128), nn.Dropout(p=0.5), nn.Linear(128, 32))
    reference = copy.deepcopy(ffn)
    assert remat.checkpoint_wrapper(ffn, second) is ffn
    x = torch.rand(4, 32, requires_grad=True)
    torch.manual_seed(1)
    out = ffn(x)
    (kept,) = [t for r in region.live_regions() for t in r.stash.kept_tensors() if t.shape == x.shape]
    assert (kept is not x) == offloads
    torch.manual_seed(1)
    assert torch.equal(out, reference(x))
    out.sum().backward()


def _norm_model(norm, precision, wrapped):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), norm(2))
    if precision == "fp16":  # parameters and buffers set one by one
        for p in model.parameters():
            p.data = p.data.half()
        for m in model:
            for name, buffer in list(m.named_buffers(recurse=False)):
                setattr(m, name, buffer.half())
    elif precision == "call_half":
        model.half()
    return remat.checkpoint_wrapper(model) if wrapped else model


@pytest.mark.parametrize("precision", ["fp32", "fp16", "call_half"])
@pytest.mark.parametrize("norm", [nn.LayerNorm, nn.BatchNorm2d])
def test_norm_layers_state_dict_and_sgd_step(norm, precision):
    reference = _norm_model(norm, precision, wrapped=False)
    model = _norm_model(norm, precision, wrapped=True)
    with torch.no_grad():  # make the wrapped copy differ, then load the plain model's state into it
        for p in model.parameters():
            p.add_(1.0)
    model.load_state_dict(reference.state_dict())
    assert list(model.state_dict()) == list(reference.state_dict())
    x = torch.rand(2, 2, 3, 3)
    if precision != "fp32":
        x = x.half()
    for m in (reference, model):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        m(x.clone().requires_grad_(True)).sum().backward()
        optimizer.step()
    want, got = reference.state_dict(), model.state_dict()
    for key in want:
        assert want[key].dtype == got[key].dtype and torch.equal(want[key], got[key]), key
    if norm is nn.BatchNorm2d:
        assert int(got["1.num_batches_tracked"]) == 1, "running statistics are updated once per step"


def test_wrapped_block_runs_twice_per_step():
    model = FeedForwardModel("remat")
    runs = []
    model.ffn[0].register_forward_hook(lambda *_: runs.append(1))
    out = model(torch.rand(2, 32, requires_grad=True))
    assert len(runs) == 1
    out.sum().backward()
    assert len(runs) == 2
