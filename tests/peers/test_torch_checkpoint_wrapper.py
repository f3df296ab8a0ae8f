"""remat's `checkpoint_wrapper` and torch's call form of `apply_activation_checkpointing` against the behaviours
torch's own tests of `torch.distributed.algorithms._checkpoint.checkpoint_wrapper` pin
(`test/distributed/fsdp/test_checkpoint_wrapper.py`), on CPU.

remat wraps in place: the module keeps its class, its attributes and its parameter names, where torch's wrapper
puts the module inside a `CheckpointWrapper` (`_checkpoint_wrapped_module`) and maps the names back for
state_dict. The tests below assert remat's form on purpose where the two differ.

Covered:
- state_dict of a wrapped Linear loads into a plain Linear, and a plain Linear's into the wrapped one; the keys are
  the plain module's (the FQN test: every named parameter is a state_dict key);
- keyword arguments: a forward `(a, b, c=None, d=None, **kwargs)` called with extra keywords gives the same four
  outputs, the same requires_grad and the same gradients as the positional call and as the plain module, with and
  without offload; a keyword-only forward `(*, a=None, b=None)`;
- the wrapper and the functional call (`remat.checkpoint` per layer) reach the same peak memory (measured here
  with `remat.peak_memory`, CPU allocator events), both below the plain model's;
- indexing and attributes of the wrapped module (an nn.Sequential; an attribute set after wrapping) are the
  module's own, as torch forwards them;
- `apply_activation_checkpointing(model, checkpoint_wrapper_fn=..., check_fn=isinstance Linear)` on a model of
  Linear + BatchNorm blocks with a nested Linear, with remat's wrapper and with torch's own wrappers (reentrant,
  non-reentrant, offload) passed as `checkpoint_wrapper_fn`: every Linear is checkpointed (the nested one too),
  nothing else; six steps called with the input by keyword give a loss that requires grad and gradients on every
  checkpointed parameter, equal to the plain model's (bitwise; with torch's offload wrapper within rounding),
  BatchNorm's running statistics included;
- on CUDA (skipped without it): with `offload_to_cpu`, what a region keeps for backward is in host memory.

Not applicable:
- torch's wrapper keywords (`checkpoint_impl`, `checkpoint_fn`, `use_reentrant`, `preserve_rng_state` as wrapper
  arguments): remat's `checkpoint_wrapper` has FairScale's signature and is always non-reentrant; code that needs
  torch's own wrapper passes it to `apply_activation_checkpointing` as `checkpoint_wrapper_fn` (tested above);
- `isinstance(m, CheckpointWrapper)`: remat returns the module itself; `"forward" in m.__dict__` (a
  `CheckpointedForward`) marks it.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    OffloadWrapper,
    offload_wrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_checkpoint_wrapper

import remat
from remat.eager import region
from remat.eager.wrappers import CheckpointedForward


def _checkpointed(module):
    return isinstance(module.__dict__.get("forward"), CheckpointedForward)


def test_state_dict_loads_both_ways_with_the_plain_keys():
    torch.manual_seed(0)
    wrapped = remat.checkpoint_wrapper(nn.Linear(10, 10, bias=False))
    plain = nn.Linear(10, 10, bias=False)
    assert list(wrapped.state_dict()) == list(plain.state_dict()) == ["weight"]
    plain.load_state_dict(copy.deepcopy(wrapped.state_dict()))
    assert torch.equal(plain.weight, wrapped.weight)
    with torch.no_grad():
        plain.weight.add_(0.5)
    wrapped.load_state_dict(copy.deepcopy(plain.state_dict()))
    assert torch.equal(plain.weight, wrapped.weight)
    names = [name for name, _ in wrapped.named_parameters()]
    assert names == ["weight"] and all(name in wrapped.state_dict() for name in names)


class FourWay(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(10, 10)

    def forward(self, a, b, c=None, d=None, **kwargs):
        return self.lin(a), self.lin(b), self.lin(c), self.lin(d)


@pytest.mark.parametrize("offload", [False, True])
def test_keyword_arguments_and_extra_keywords(offload):
    plain = FourWay()
    model = remat.checkpoint_wrapper(FourWay(), offload_to_cpu=offload)
    inp = torch.ones(4, 10, requires_grad=True)
    with_keywords = model(inp, inp, c=inp, d=inp, e=inp, f=inp)
    positional = model(inp, inp, inp, inp)
    reference = plain(inp, inp, inp, inp)
    assert isinstance(with_keywords, tuple) and len(with_keywords) == 4
    for a, b, r in zip(with_keywords, positional, reference):
        assert torch.equal(a, b) and torch.equal(a, r) and a.requires_grad == b.requires_grad == r.requires_grad
    grads = []
    for outs, module in ((with_keywords, model), (positional, model), (reference, plain)):
        module.zero_grad(set_to_none=True)
        inp.grad = None
        sum((k + 1) * o.sum() for k, o in enumerate(outs)).backward()
        grads.append([inp.grad, module.lin.weight.grad, module.lin.bias.grad])
    for got in grads[:2]:
        assert all(torch.equal(g, w) for g, w in zip(got, grads[2]))


def test_keyword_only_forward():
    class KeywordOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(10, 10)

        def forward(self, *, a=None, b=None):
            return self.lin(a), self.lin(b)

    torch.manual_seed(0)
    plain = KeywordOnly()
    model = remat.checkpoint_wrapper(copy.deepcopy(plain))
    grads = []
    for module in (model, plain):
        inp = torch.ones(4, 10, requires_grad=True)
        out = module(a=inp, b=inp * 2)
        assert len(out) == 2
        (out[0] + 3 * out[1]).sum().backward()
        grads.append([out[0].detach(), out[1].detach(), inp.grad, module.lin.weight.grad])
    assert all(torch.equal(g, w) for g, w in zip(*grads))
    with pytest.raises(TypeError):
        model(torch.ones(4, 10))  # keyword-only parameters stay keyword-only


class Stack(nn.Module):
    def __init__(self, how):
        super().__init__()
        torch.manual_seed(0)
        self.how = how
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 256)) for _ in range(8)
        )
        if how == "wrapper":
            for layer in self.layers:
                remat.checkpoint_wrapper(layer)

    def forward(self, x):
        for layer in self.layers:
            x = remat.checkpoint(layer, x) if self.how == "functional" else layer(x)
        return x


def test_wrapper_and_functional_checkpoint_reach_the_same_peak():
    x = torch.randn(512, 256, requires_grad=True)
    peaks = {}
    for how in ("plain", "wrapper", "functional"):
        model = Stack(how)

        def step():
            model(x).sum().backward()

        peaks[how] = remat.peak_memory(step, exclude=lambda: [p.grad for p in model.parameters()] + [x.grad])
        x.grad = None
    assert peaks["wrapper"] == peaks["functional"] < peaks["plain"], peaks


def test_indexing_and_attributes_are_the_modules_own():
    lin = nn.Linear(1, 1)
    seq = nn.Sequential(lin, lin)
    wrapped = remat.checkpoint_wrapper(seq)
    assert wrapped is seq and wrapped[0] is lin and type(wrapped) is nn.Sequential
    seq._foo = "bar"
    assert wrapped._foo == "bar"


class LinearWithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 10)
        self.bn = nn.BatchNorm1d(10)
        self.nested_linear = nn.Sequential(nn.Linear(10, 10))

    def forward(self, x):
        return self.bn(self.nested_linear(self.lin(x)))


class ThreeBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.seq = nn.Sequential(LinearWithBatchNorm(), LinearWithBatchNorm(), LinearWithBatchNorm())

    def forward(self, x):
        return self.seq(x)


WRAPPERS = {
    "remat": remat.checkpoint_wrapper,
    "torch_reentrant": functools.partial(torch_checkpoint_wrapper, checkpoint_impl=CheckpointImpl.REENTRANT),
    "torch_no_reentrant": functools.partial(torch_checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
    "torch_offload": offload_wrapper,
}


def _unwrapped(module):
    return getattr(module, "_checkpoint_wrapped_module", module)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_apply_with_check_fn_wraps_every_linear_and_trains(wrapper):
    model, plain = ThreeBlocks(), ThreeBlocks()
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    out = remat.apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=WRAPPERS[wrapper], check_fn=lambda m: isinstance(m, nn.Linear)
    )
    assert out is model and sum(isinstance(m, nn.Linear) for m in model.modules()) == linears == 6
    if wrapper == "remat":
        marked = [m for m in model.modules() if _checkpointed(m)]
        assert len(marked) == linears and all(isinstance(m, nn.Linear) for m in marked)
        assert all(_checkpointed(model.seq[j].lin) and _checkpointed(model.seq[j].nested_linear[0]) for j in range(3))
        assert list(model.state_dict()) == list(plain.state_dict())
    else:
        kinds = (CheckpointWrapper, OffloadWrapper)
        assert sum(isinstance(m, kinds) for m in model.modules()) == linears
        assert all(
            isinstance(model.seq[j].lin, kinds) and isinstance(model.seq[j].nested_linear[0], kinds) for j in range(3)
        )
    torch.manual_seed(1)
    inp = torch.randn(4, 10, requires_grad=True)
    weight = torch.randn(4, 10)  # a plain sum of BatchNorm's output has gradients of rounding noise only
    for _ in range(6):
        for m in (model, plain):
            m.zero_grad(set_to_none=True)
        loss = (model(x=inp) * weight).sum()
        assert loss.requires_grad
        loss.backward()
        (plain(x=inp) * weight).sum().backward()
        for j in range(3):
            for lin in (_unwrapped(model.seq[j].lin), _unwrapped(model.seq[j].nested_linear[0])):
                assert lin.weight.requires_grad and lin.weight.grad is not None and lin.bias.grad is not None
        got = [p.grad for p in model.parameters()]
        want = [p.grad for p in plain.parameters()]
        assert len(got) == len(want) == 18
        for g, w in zip(got, want):
            if wrapper == "torch_offload":  # torch's save_on_cpu hands back copies whose matmuls round differently
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(g, w)
    got, want = list(model.buffers()), list(plain.buffers())
    assert len(got) == len(want) == 9 and all(torch.equal(g, w) for g, w in zip(got, want))
    assert int(_unwrapped(model.seq[0]).bn.num_batches_tracked) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host offload is visible only with a device (CUDA)")
def test_offload_keeps_the_regions_inputs_in_host_memory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 10)).cuda()
    plain = copy.deepcopy(model)
    remat.checkpoint_wrapper(model, offload_to_cpu=True)
    inp = torch.randn(3, 10, device="cuda", requires_grad=True)
    loss = model(inp).sum()
    kept = [t for r in region.live_regions() for t in r.stash.kept_tensors() if not isinstance(t, nn.Parameter)]
    assert kept and all(t.device.type == "cpu" for t in kept)
    del kept
    loss.backward()
    got = [p.grad for p in model.parameters()] + [inp.grad]
    inp.grad = None
    plain(inp).sum().backward()
    want = [p.grad for p in plain.parameters()] + [inp.grad]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
