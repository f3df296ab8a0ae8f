"""`remat.checkpoint` and `remat.set_activation_checkpointing` against the behaviours SageMaker model parallel's own
activation-checkpointing tests pin (smdistributed.modelparallel's `TestActivationCheckpointing`), on CPU.

Each case: a model of two Linears then two inner modules, the inner ones checkpointed; gradients of every parameter
equal the plain model's — bitwise here, where smp allows a tolerance.

Covered:
- `set_activation_checkpointing` on each inner module; on an nn.Sequential built from modules the model also holds
  as attributes; on the children of one nn.Sequential only — those children run twice per step, the other
  Sequential's children once;
- `checkpoint(module, x)` on each inner module (the functional API);
- inner forwards taking `*args, **kwargs`, by both APIs;
- keyword parameters with defaults (a tensor default among them) left unused, used, and partly passed by the
  caller (`some_option=False`, a tensor passed as `tensor_option=`), by both APIs;
- a tuple returned (output and an intermediate, both used later), and a list of tensors passed as the first
  argument.

Not applicable:
- `smp.init`, `smp.DistributedModel`, `@smp.step` and the data-parallel slice of the batch: smp's runtime (remat
  checkpoints the module the user runs);
- the CUDA device the tests run on: these run on CPU (`tensor_option.to("cuda")` becomes the tensor itself).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import remat

WIDTH = 20


class Inner(nn.Module):
    """Two Linears; `kind` picks the signature: "x", "args" (*args, **kwargs), "options" (keyword defaults),
    "tuple" (also returns the intermediate), "list" (a list of two tensors first, returns a tuple)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.lin2, self.lin3 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.runs = 0

    def forward(self, *args, **kwargs):
        self.runs += 1
        if self.kind == "x":
            return self.lin3(self.lin2(*args))
        if self.kind == "args":
            return self.lin3(self.lin2(args[0]))
        return self._options(*args, **kwargs)

    def _options(self, x, some_option=True, another_option=3, yet_another=None, tensor_option=torch.ones(WIDTH, WIDTH)):
        if self.kind == "list":
            first, second = x
            intermediate = self.lin2(first) + self.lin2(second)
        else:
            intermediate = self.lin2(x)
        h = intermediate @ tensor_option if some_option else intermediate
        out = self.lin3(h)
        return (out, intermediate) if self.kind in ("tuple", "list") else out


class Model(nn.Module):
    """lin0, lin1, inner1, inner2; `call` says how the inner modules are called."""

    def __init__(self, kind="x", call="plain", sequential=False):
        super().__init__()
        torch.manual_seed(0)
        self.lin0, self.lin1 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.inner1, self.inner2 = Inner(kind), Inner(kind)
        self.kind, self.call = kind, call
        self.seq = nn.Sequential(self.lin0, self.lin1, self.inner1, self.inner2) if sequential else None

    def _inner(self, module, *args, **kwargs):
        return remat.checkpoint(module, *args, **kwargs) if self.call == "checkpoint" else module(*args, **kwargs)

    def forward(self, x):
        if self.seq is not None:
            return torch.flatten(self.seq(x), 1)
        x = self.lin1(self.lin0(x))
        if self.kind in ("x", "args", "options"):
            x = self._inner(self.inner2, self._inner(self.inner1, x))
        elif self.kind == "partly":
            x = self._inner(self.inner1, x, some_option=False)
            x = self._inner(self.inner2, x, some_option=True, tensor_option=0.1 * torch.ones(WIDTH, WIDTH))
        else:
            first = [x, x] if self.kind == "list" else x
            x, y = self._inner(self.inner1, first, some_option=False)
            second = [x, y] if self.kind == "list" else x
            x, z = self._inner(self.inner2, second, some_option=True, tensor_option=0.1 * torch.ones(WIDTH, WIDTH))
            x = x + y + z
        return torch.flatten(x, 1)


def _grads(model):
    torch.manual_seed(42)
    x, y = torch.randn(16, WIDTH, WIDTH), torch.randint(0, 10, (16,))
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _assert_equal_grads(model, reference):
    got, want = _grads(model), _grads(reference)
    assert list(got) == list(want) and len(want) >= 12
    for name in want:
        assert got[name] is not None and torch.equal(got[name], want[name]), name


# "partly" passes some keyword arguments; its Inner takes keyword options like "options"
KINDS = {"x": "x", "args": "args", "options": "options", "partly": "options", "tuple": "tuple", "list": "list"}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("api", ["set_activation_checkpointing", "checkpoint"])
def test_inner_modules_checkpointed_give_the_plain_gradients(api, kind):
    reference = Model(KINDS[kind])
    reference.kind = kind
    model = copy.deepcopy(reference)
    if api == "checkpoint":
        model.call = "checkpoint"
    else:
        remat.set_activation_checkpointing(model.inner1)
        remat.set_activation_checkpointing(model.inner2)
    _assert_equal_grads(model, reference)
    assert (model.inner1.runs, model.inner2.runs) == (2, 2)
    assert (reference.inner1.runs, reference.inner2.runs) == (1, 1)


def test_sequential_of_modules_the_model_also_holds():
    reference = Model(sequential=True)
    model = copy.deepcopy(reference)
    remat.set_activation_checkpointing(model.seq)
    _assert_equal_grads(model, reference)
    assert model.seq[2] is model.inner1 and (model.inner1.runs, model.inner2.runs) == (2, 2)


def test_children_of_one_sequential_run_twice_the_others_once():
    reference = Model()
    reference.inner1 = nn.Sequential(Inner("x"), Inner("x"))
    reference.inner2 = nn.Sequential(Inner("x"), Inner("x"))
    model = copy.deepcopy(reference)
    for child in model.inner1.children():
        remat.set_activation_checkpointing(child)
    _assert_equal_grads(model, reference)
    assert [child.runs for child in model.inner1] == [2, 2]
    assert [child.runs for child in model.inner2] == [1, 1]
