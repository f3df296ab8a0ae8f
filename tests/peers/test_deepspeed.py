"""`remat.checkpointing` against the behaviours DeepSpeed's own activation-checkpointing tests pin
(`tests/unit/runtime/activation_checkpointing/test_activation_checkpointing.py`), on CPU fp32 and bitwise.

Covered (each compares outputs, input and parameter gradients with the plain, uncheckpointed call):
- one input, one output (a Linear on a 1-D input);
- a tensor and a mask (bool, not differentiable, and float) in, one output;
- the mask handed back as a second output; a third, detached output first, in another order than the inputs;
- None as an argument;
- non-tensor arguments (None, an int, a bool, tuples mixing None, floats, bools and a tensor);
- non-tensor outputs, their values and their position among the outputs (the tensor/non-tensor ordering);
- keyword arguments, a tensor that needs grad and a float, to a function with keyword-only parameters;
- inputs used again after a checkpoint with partitioned or host-kept inputs: DeepSpeed frees such inputs and
  raises "deallocated by a previous activation checkpoint" when one is passed to a later checkpoint. remat keeps
  its own shard or host copy and never frees the caller's tensor, so the same calls work and match the plain model
  (asserted here on purpose), for `checkpoint` and `non_reentrant_checkpoint`; the same tensor passed twice too;
- attributes an application sets on an input tensor (`saved_data`, `ds_offload_id`) change nothing;
- host offload (`checkpoint_in_cpu`) over four stacked layers: parity, and the profile shows one offload and one
  reload per layer; a bool mask next to the float activation keeps parity;
- forwards under `torch.no_grad()` with offload on keep nothing and offload nothing;
- `contiguous_checkpointing` without `num_checkpoints`: DeepSpeed's configure asserts ("number of layers"); remat
  learns the buffer count on the first step instead (asserted on purpose), and the step matches the plain model.
Beyond DeepSpeed's tests, which run in eval mode "until the RNG is forked between tests": the same parity in
training mode with dropout, and the region's forward runs exactly twice (forward and one recomputation).

Not applicable:
- `PipelineModule(checkpointable_layers=...)`: DeepSpeed's pipeline engine, not part of `deepspeed.checkpointing`;
- the async offload engine's internals (keep-last flush, tracker sizes): DeepSpeed's implementation, observed here
  through remat's profile instead; real device-to-host copies need CUDA (on CPU the host copy is a copy);
- snapshot/restore of DeepSpeed's module globals (`PARTITION_ACTIVATIONS`, `mpu`, ...): remat keeps its settings in
  one record (`get_settings()`); the fixture below resets it;
- model-parallel partitioning across ranks: DeepSpeed's file has none; remat's 2-rank gloo tests are in
  tests/test_eager_distributed.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from remat import checkpointing
from remat.eager import region
from remat.runtime import buffers

from eager_models import fresh_checkpointing_state

WIDTH = 20
CHECKPOINTS = {
    "checkpoint": checkpointing.checkpoint,
    "non_reentrant_checkpoint": checkpointing.non_reentrant_checkpoint,
}


@pytest.fixture(autouse=True)
def unconfigured():
    """Each test starts with remat.checkpointing unconfigured and an empty pool, and leaves it so."""
    with fresh_checkpointing_state():
        yield


class Gated(nn.Linear):
    """A Linear whose output is multiplied by a mask; `returns` picks what comes back."""

    def __init__(self, returns="out"):
        super().__init__(WIDTH, WIDTH)
        self.returns = returns

    def forward(self, x, mask):
        out = super().forward(x) * mask.to(x.dtype)
        if self.returns == "out, mask":
            return out, mask
        if self.returns == "copy, out, mask":
            return x.detach() * 0.5, out, mask
        return out


class IgnoresSecond(nn.Linear):
    def __init__(self):
        super().__init__(WIDTH, WIDTH)

    def forward(self, x, other):
        return super().forward(x)


class ReturnsExtra(nn.Linear):
    """Returns its output and, after it, a fixed non-tensor (or mixed) value."""

    def __init__(self, extra):
        super().__init__(WIDTH, WIDTH)
        self.extra = extra

    def forward(self, x):
        return super().forward(x), self.extra


class Counting(nn.Module):
    """Linear, dropout, tanh; counts its forward runs."""

    def __init__(self):
        super().__init__()
        self.lin, self.drop, self.runs = nn.Linear(WIDTH, WIDTH), nn.Dropout(0.3), 0

    def forward(self, x):
        self.runs += 1
        return torch.tanh(self.drop(self.lin(x)))


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def _fresh(value):
    """A copy of an argument: tensors cloned with their requires_grad, other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, tuple):
        return tuple(_fresh(v) for v in value)
    return value


def _run(module, args, checkpointed, fn=checkpointing.checkpoint, seed=3):
    """One step of `module(*args)`, checkpointed or not: (outputs, input grads, parameter grads)."""
    module = copy.deepcopy(module)
    args = tuple(_fresh(a) for a in args)
    torch.manual_seed(seed)
    outputs = fn(module, *args) if checkpointed else module(*args)
    differentiable = [t for t in _flat(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    assert differentiable
    # distinct weights, so an output handed back in the wrong place shows in the gradients
    sum((k + 1) * t.square().sum() for k, t in enumerate(differentiable)).backward()
    inputs = [t.grad for t in _flat(args) if isinstance(t, torch.Tensor) and t.requires_grad]
    return outputs, inputs, [p.grad for p in module.parameters()]


def _assert_same(want, got):
    """Same structure, same non-tensor values, bitwise-equal tensors with the same requires_grad."""
    assert type(want) is type(got), (want, got)
    if isinstance(want, (tuple, list)):
        assert len(want) == len(got)
        for a, b in zip(want, got):
            _assert_same(a, b)
    elif isinstance(want, torch.Tensor):
        assert want.dtype == got.dtype and want.requires_grad == got.requires_grad
        assert torch.equal(want, got), (want - got).abs().max()
    else:
        assert want == got


def _parity(module, *args, fn=checkpointing.checkpoint):
    want = _run(module, args, checkpointed=False)
    got = _run(module, args, checkpointed=True, fn=fn)
    _assert_same(want, got)
    assert all(g is not None for g in want[1] + want[2])
    return got


def _mask(kind):
    bits = torch.Generator().manual_seed(7)
    mask = torch.rand(WIDTH, generator=bits) > 0.5
    return mask if kind == "bool" else mask.float()


def _x():
    torch.manual_seed(1)
    return torch.rand(WIDTH, requires_grad=True)


def _module(cls, *args):
    torch.manual_seed(0)
    return cls(*args)


def test_one_input_one_output():
    torch.manual_seed(0)
    _parity(nn.Linear(WIDTH, WIDTH), _x())


@pytest.mark.parametrize("mask", ["bool", "float"])
@pytest.mark.parametrize("returns", ["out", "out, mask", "copy, out, mask"])
def test_tensor_and_mask_in_one_to_three_outputs(mask, returns):
    outputs = _parity(_module(Gated, returns), _x(), _mask(mask))[0]
    if returns != "out":
        assert torch.equal(outputs[-1], _mask(mask)) and not outputs[-1].requires_grad
    if returns == "copy, out, mask":
        assert not outputs[0].requires_grad


@pytest.mark.parametrize("other", [None, 2, True, (None, 2.5), (None, True, "tensor")], ids=repr)
def test_non_tensor_and_none_arguments(other):
    if isinstance(other, tuple) and "tensor" in other:
        other = other[:-1] + (torch.randn(WIDTH),)
    _parity(_module(IgnoresSecond), _x(), other)


@pytest.mark.parametrize(
    "extra", [None, 2, True, (None, 2.5), ("tensor", 2.5), (None, "tensor", True), (None, True, "tensor")], ids=repr
)
def test_non_tensor_outputs_keep_their_values_and_order(extra):
    if isinstance(extra, tuple):
        extra = tuple(torch.randn(WIDTH) if e == "tensor" else e for e in extra)
    outputs = _parity(_module(ReturnsExtra, extra), _x())[0]
    expected = [True] + [isinstance(e, torch.Tensor) for e in _flat(extra)]
    assert [isinstance(o, torch.Tensor) for o in _flat(outputs)] == expected


def test_keyword_arguments_tensor_and_float():
    torch.manual_seed(0)
    value, scale = torch.randn(WIDTH, requires_grad=True), torch.randn(WIDTH, requires_grad=True)

    def affine(v, *, scale, offset):
        return v * scale + offset

    want = affine(value, scale=scale, offset=1.5)
    want.sum().backward()
    want_grads = [value.grad.clone(), scale.grad.clone()]
    value.grad = scale.grad = None
    got = checkpointing.checkpoint(affine, value, scale=scale, offset=1.5)
    got.sum().backward()
    assert torch.equal(got, want) and torch.equal(value.grad, want_grads[0]) and torch.equal(scale.grad, want_grads[1])


def _add(hidden, shared):
    return torch.tanh(hidden + shared)


def _add_nested(hidden, nested):
    return torch.tanh(hidden * nested["value"][0][0])


def _reuse_steps(fn):
    """Checkpoints whose inputs are an earlier checkpoint's output and input (also inside a nested dict), and the
    same tensor passed twice: (outputs, input grads)."""
    torch.manual_seed(2)
    hidden, shared, alias = (torch.randn(4, 4, requires_grad=True) for _ in range(3))
    first = fn(_add, hidden, shared)
    second = fn(_add, first, shared)
    third = fn(_add_nested, first, {"value": ([shared],)})
    fourth = fn(_add, alias, alias)
    outputs = [first, second, third, fourth]
    sum((k + 1) * o.sum() for k, o in enumerate(outputs)).backward()
    return [o.detach() for o in outputs] + [hidden.grad, shared.grad, alias.grad]


@pytest.mark.parametrize("partition, in_cpu", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_inputs_used_again_after_a_partitioned_or_host_kept_checkpoint(name, partition, in_cpu):
    """DeepSpeed raises "deallocated by a previous activation checkpoint" here; remat keeps its own copy of
    each input and never frees the caller's tensor, so every call works and matches the plain calls."""
    want = _reuse_steps(lambda f, *a: f(*a))
    checkpointing.configure(mpu_=None, partition_activations=partition, checkpoint_in_cpu=in_cpu, profile=True)
    got = _reuse_steps(CHECKPOINTS[name])
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    step = checkpointing.get_profile().steps[-1]
    assert step.calls["recompute"] == 4
    assert step.calls["offload"] == (8 if in_cpu else 0)  # two tensor inputs per checkpoint


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_attributes_an_application_sets_on_inputs_change_nothing(name):
    checkpointing.configure(mpu_=None, partition_activations=False, checkpoint_in_cpu=False)
    torch.manual_seed(2)
    hidden, shared = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    marker, offload_id = object(), object()
    shared.saved_data, shared.ds_offload_id = marker, offload_id
    ref_hidden, ref_shared = _fresh(hidden), _fresh(shared)
    want = _add(ref_hidden, ref_shared)
    want.sum().backward()
    got = CHECKPOINTS[name](_add, hidden, shared)
    got.sum().backward()
    assert torch.equal(got, want) and torch.equal(shared.grad, ref_shared.grad)
    assert torch.equal(hidden.grad, ref_hidden.grad)
    assert shared.saved_data is marker and shared.ds_offload_id is offload_id


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_host_offload_over_stacked_layers(name):
    torch.manual_seed(1234)
    layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(4))
    ref = copy.deepcopy(layers)
    x = torch.randn(8, 256)

    def step(stack, fn):
        h = x.clone().requires_grad_()
        out = h
        for layer in stack:
            out = fn(layer, out)
        out.sum().backward()
        return [out.detach(), h.grad] + [p.grad for p in stack.parameters()]

    want = step(ref, lambda layer, h: layer(h))
    checkpointing.configure(mpu_=None, checkpoint_in_cpu=True, profile=True)
    got = step(layers, CHECKPOINTS[name])
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and len(got) == len(want)
    step_record = checkpointing.get_profile().steps[-1]
    assert step_record.calls["offload"] == 4 and step_record.calls["reload"] == 4
    assert step_record.bytes["offload"] == 4 * 8 * 256 * 4


def test_host_offload_with_a_bool_mask_next_to_the_activation():
    checkpointing.configure(mpu_=None, checkpoint_in_cpu=True)
    _parity(_module(Gated), _x(), _mask("bool"))


def test_no_grad_forwards_keep_and_offload_nothing():
    checkpointing.configure(mpu_=None, checkpoint_in_cpu=True, profile=True)
    torch.manual_seed(0)
    layers = [Counting() for _ in range(3)]
    h = torch.randn(4, WIDTH)
    with torch.no_grad():
        for layer in layers:
            h = checkpointing.checkpoint(layer, h)
    assert region.live_regions() == [] and [layer.runs for layer in layers] == [1, 1, 1]
    assert sum(step.calls["offload"] for step in checkpointing.get_profile().steps) == 0


def test_contiguous_without_num_checkpoints_learns_the_count():
    """DeepSpeed's configure asserts that contiguous checkpointing names the number of layers; remat learns it."""
    checkpointing.configure(mpu_=None, partition_activations=True, contiguous_checkpointing=True)
    assert checkpointing.get_settings().num_checkpoints is None
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))
    x = torch.randn(4, WIDTH)
    start = buffers.POOL.stats.allocations
    ref = copy.deepcopy(layers)

    def step(stack, fn):
        for p in stack.parameters():
            p.grad = None
        h = x.clone().requires_grad_()
        out = h
        for layer in stack:
            out = fn(layer, out)
        out.square().sum().backward()
        return [out.detach(), h.grad] + [p.grad.clone() for p in stack.parameters()]

    want = step(ref, lambda layer, h: layer(h))
    for _ in range(3):
        got = step(layers, checkpointing.checkpoint)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert buffers.POOL.stats.allocations - start == 3, "one arena per checkpoint, learned on the first step"


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_dropout_in_training_mode_and_one_recomputation(name):
    torch.manual_seed(0)
    module = Counting()
    want = _run(module, (_x(),), checkpointed=False)
    got = _run(module, (_x(),), checkpointed=True, fn=CHECKPOINTS[name])
    _assert_same(want, got)
    torch.manual_seed(0)
    counted = Counting()
    out = CHECKPOINTS[name](counted, _x())
    assert counted.runs == 1
    out.sum().backward()
    assert counted.runs == 2
