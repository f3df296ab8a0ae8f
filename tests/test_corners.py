"""The awkward corners of torch.compile: dynamic shapes, graph breaks, no-grad and eval, double backward, mutated and
aliased inputs/outputs, unused outputs, autocast, retain_graph, tensor hooks, fullgraph, compiling twice."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat.capture import hooked_nodes

AOT = {"inner": "aot_eager"}


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    """Each test sees only the plans of its own compiles."""
    monkeypatch.setattr("remat.backend._plans", [])


class Net(nn.Module):
    def __init__(self, width: int = 64, dropout: float = 0.0):
        super().__init__()
        self.a, self.b = nn.Linear(32, width), nn.Linear(width, 32)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return torch.tanh(self.b(self.drop(F.gelu(self.a(x))))).square().mean()


def net(**kw) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Net(**kw)


def grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters()]


def same(xs, ys) -> bool:
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


def weights(n: int, size: int = 64) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    return [(torch.randn(size, size, generator=gen) / size**0.5).requires_grad_() for _ in range(n)]


def test_dynamic_batch_is_replanned_symbolically_and_correct():
    eager = net()
    model = copy.deepcopy(eager)
    step = torch.compile(model, backend="remat", options={"memory_budget": 0.0, **AOT})
    for batch in (4, 5, 6):
        x = torch.randn(batch, 32)
        eager.zero_grad(), model.zero_grad()
        eager(x).backward(), step(x).backward()
        assert same(grads(model), grads(eager)), batch
    static, dynamic = remat.recent_plans()  # batch 4 static; batch 5 recompiles with a symbolic batch; 6 reuses it
    assert not static.peak_bytes_expr.free_symbols
    (batch,) = dynamic.peak_bytes_expr.free_symbols
    assert dynamic.peak_bytes == int(dynamic.peak_bytes_expr.subs(batch, 5))
    assert int(dynamic.peak_bytes_expr.subs(batch, 4)) == static.peak_bytes  # one formula, the same plan at 4


class CosChain(nn.Module):
    def __init__(self, depth: int, width: int = 128):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(w.detach()) for w in weights(depth, width))

    def forward(self, x):
        for w in self.weights:
            x = torch.cos(x @ w)
        return x


class TwoGraphs(nn.Module):
    """A 4-layer and a 6-layer chain of 32 KiB activations, split by a graph break."""

    def __init__(self):
        super().__init__()
        self.first, self.second = CosChain(4), CosChain(6)

    def forward(self, x):
        y = self.first(x)
        torch._dynamo.graph_break()
        return self.second(y).square().mean()


def test_graph_break_plans_both_graphs_under_one_byte_budget_for_the_step():
    eager = TwoGraphs()
    model = copy.deepcopy(eager)
    x = torch.randn(64, 128)
    eager(x).backward()
    budget = 330 * 1024  # below the second graph's baseline peak with what the first keeps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        remat.compile(model, memory_budget=budget, **AOT)(x).backward()
    assert not [w for w in caught if "cannot be met" in str(w.message)]
    assert same(grads(model), grads(eager))
    first, second = remat.recent_plans()
    # The first graph, which a later one follows, keeps less than its baseline though that would fit (as little as
    # leaves room for a graph like it); the second gets what the first leaves: less its saved values and its
    # output, live while the second runs.
    assert first.budget_bytes == budget and first.baseline.peak_bytes <= budget
    assert first.saved_bytes < first.baseline.saved_bytes
    assert second.budget_bytes == budget - first.saved_bytes - x.nbytes < second.baseline.peak_bytes
    for plan in (first, second):
        assert plan.feasible and plan.peak_bytes <= plan.budget_bytes and plan.recompute_flops > 0
    assert first.baseline.peak_bytes < second.baseline.peak_bytes  # two different graphs, reported apart


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "eval_no_grad"])
def test_no_grad_and_inference_do_no_planning(mode, monkeypatch):
    calls = []
    real = remat.backend.plan_joint
    monkeypatch.setattr("remat.backend.plan_joint", lambda *a, **k: calls.append(1) or real(*a, **k))
    eager = net(dropout=0.1)
    model = copy.deepcopy(eager)
    step = torch.compile(model, backend="remat", options={"memory_budget": 0.0, **AOT})
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    if mode == "eval_no_grad":
        eager.eval(), model.eval()
    x = torch.randn(8, 32)
    with context():
        torch.manual_seed(0)
        want = eager(x)
        torch.manual_seed(0)
        got = step(x)
    assert torch.equal(got, want)
    assert calls == [] and remat.recent_plans() == ()
    assert all(p.grad is None for p in model.parameters())


def test_eval_mode_with_grad_is_planned_without_dropout():
    eager = net(dropout=0.5).eval()
    model = copy.deepcopy(eager)
    x = torch.randn(8, 32)
    eager(x).backward()
    torch.compile(model, backend="remat", options={"memory_budget": 0.0, **AOT})(x).backward()
    assert same(grads(model), grads(eager))
    (plan,) = remat.recent_plans()
    assert not [d for d in plan.decisions if "random" in d.reason or "dropout" in d.op]


def test_double_backward_matches_torch_aot_eager():
    """First-order gradients with create_graph=True are right; the second order fails exactly as under torch's own
    aot_eager (aot_autograd's compiled backward is not differentiable), never with a silently wrong answer."""
    (w,) = weights(1)
    x = torch.randn(64, 64)

    def f(x):
        return torch.sin(x @ w).square().sum()

    (want,) = torch.autograd.grad(f(x), w, create_graph=True)
    outcomes = []
    for backend, options in (("aot_eager", None), ("remat", {"memory_budget": 0.0, **AOT})):
        torch._dynamo.reset()
        (g,) = torch.autograd.grad(torch.compile(f, backend=backend, options=options)(x), w, create_graph=True)
        assert torch.equal(g.detach(), want.detach()), backend
        with pytest.raises(RuntimeError) as info:
            torch.autograd.grad(g.square().sum(), w)
        outcomes.append(str(info.value))
    assert outcomes[0] == outcomes[1]


def test_inputs_mutated_in_place():
    (w,) = weights(1)

    def f(x, buf):
        x.mul_(2)
        buf.add_(1)
        return (torch.cos(torch.sin(x @ w)) * buf).sum()

    x, buf = torch.randn(64, 64), torch.zeros(64)
    x2, buf2 = x.clone(), buf.clone()
    (want,) = torch.autograd.grad(f(x, buf), w)
    (got,) = torch.autograd.grad(remat.compile(f, memory_budget=0.0, **AOT)(x2, buf2), w)
    assert torch.equal(got, want) and torch.equal(x2, x) and torch.equal(buf2, buf)
    assert torch.equal(buf2, torch.ones(64))


def test_outputs_aliasing_inputs_and_views_of_saved_values():
    """Outputs equal eager's and alias as in eager. Gradients equal torch's own aot_eager bitwise; eager sums the
    three gradients flowing into y in another order, so against eager they agree to rounding."""
    (w,) = weights(1)

    def f(x):
        y = torch.sin(x @ w)  # saved for backward (cos reads it)
        return x.view(-1), y.t(), y[:2], torch.cos(y).sum()

    def loss(outs):
        flat, yt, head, total = outs
        return flat.sum() + (yt * yt).sum() + head.exp().sum() + total

    x = torch.randn(64, 64, requires_grad=True)
    x2, x3 = (x.detach().clone().requires_grad_() for _ in range(2))
    want = f(x)
    got = remat.compile(f, memory_budget=0.0, **AOT)(x2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0]._base is x2  # still a view of the input, as in eager
    torch._dynamo.reset()
    torch_aot = torch.autograd.grad(loss(torch.compile(f, backend="aot_eager")(x3)), [x3, w])
    got_grads = torch.autograd.grad(loss(got), [x2, w])
    assert same(got_grads, torch_aot)
    for a, b in zip(got_grads, torch.autograd.grad(loss(want), [x, w])):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)


def test_multiple_outputs_some_unused():
    w, v = weights(2)

    def f(x):
        y = torch.sin(x @ w)
        z = torch.cos(y @ v)
        return y, z, torch.exp(z)  # the third is never used

    x = torch.randn(64, 64)
    y, z, _ = f(x)
    want = torch.autograd.grad(y.sum() + z.square().sum(), [w, v])
    y, z, unused = remat.compile(f, memory_budget=0.0, **AOT)(x)
    assert same(torch.autograd.grad(y.sum() + z.square().sum(), [w, v]), want)
    assert unused.requires_grad


def test_autocast_bf16_on_cpu():
    eager = net()
    model = copy.deepcopy(eager)
    x = torch.randn(16, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = eager(x)
        got = torch.compile(model, backend="remat", options={"memory_budget": 0.0, **AOT})(x)
    want.backward(), got.backward()
    assert torch.equal(got, want) and same(grads(model), grads(eager))
    (plan,) = remat.recent_plans()
    bf16 = [d for d in plan.decisions if d.dtype == "bfloat16" and d.nbytes]
    assert bf16 and all(d.nbytes == 2 * math.prod(d.shape) for d in bf16)  # 2 bytes per element


def test_retain_graph_second_backward():
    eager = net()
    model = copy.deepcopy(eager)
    x = torch.randn(16, 32)
    step = remat.compile(model, memory_budget=0.0, **AOT)
    for module in (eager, step):
        loss = module(x)
        loss.backward(retain_graph=True)
        loss.backward()
    assert same(grads(model), grads(eager))
    assert remat.last_plan().recompute_flops > 0  # recomputation ran in both backward passes


def hooked_chain(hook_kind: str):
    w1, w2, w3 = weights(3, 256)

    def f(x):
        a = torch.cos(x @ w1)
        if hook_kind == "scale":
            a.register_hook(lambda g: g * 2)
        elif hook_kind == "closure":  # the hook reads the hooked value itself
            a.register_hook(lambda g: g * a)
        h = F.layer_norm(torch.sin(a), (256,))
        if hook_kind != "none":
            h.register_hook(lambda g: g + 1)
        b = torch.cos(h @ w2)
        return torch.sin(b @ w3).sum()

    return f, [w1, w2, w3]


def traced_hooks(f, x) -> tuple[frozenset[str], int]:
    """How dynamo traces `f`'s tensor hooks: the nodes the register_hook higher-order op hooks (torch 2.13 on), and
    the number of autograd_function_apply ops (torch 2.11 and 2.12 trace a hook on an intermediate as an autograd
    function whose backward runs the hook: the hook is then part of the joint graph)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(f, backend=keep)(x)
    torch._dynamo.reset()
    applies = sum(
        1 for gm in graphs for n in gm.graph.nodes if "autograd_function_apply" in str(getattr(n, "target", ""))
    )
    return frozenset().union(*(hooked_nodes(gm) for gm in graphs)), applies


@pytest.mark.parametrize("hook_kind", ["scale", "closure"])
def test_hooked_values_are_saved_not_recomputed(hook_kind):
    f, params = hooked_chain(hook_kind)
    x = torch.randn(256, 256)
    want = torch.autograd.grad(f(x), params)
    got = torch.autograd.grad(remat.compile(f, memory_budget=0.0, **AOT)(x), params)
    assert same(got, want)
    plan = remat.last_plan()
    hooked, applies = traced_hooks(f, x)
    if not hooked:
        # This torch traces each hook into the graph (its backward runs the hook on the gradient, reading the
        # recomputed value where the closure reads it): no hook is left to run outside, so nothing must be saved.
        assert applies == 2 and not any("tensor hook" in d.reason for d in plan.decisions)
        assert plan.recompute_flops > 0
        return
    hooked = {d.name: d for d in plan.decisions if "tensor hook" in d.reason}
    assert {d.op for d in hooked.values()} == {"aten.cos.default", "getitem"}  # a, and layer_norm's output
    assert all(d.action is remat.Action.SAVE for d in hooked.values())
    assert plan.recompute_flops > 0  # the budget still recomputes what is not hooked
    unhooked = remat.explain(hooked_chain("none")[0], x, memory_budget=0.0)
    assert [d.action for d in unhooked.decisions if d.op == "aten.cos.default"][0] is remat.Action.RECOMPUTE


def test_fullgraph():
    eager = net()
    model = copy.deepcopy(eager)
    x = torch.randn(16, 32)
    eager(x).backward()
    torch.compile(model, backend="remat", fullgraph=True, options={"memory_budget": 0.0, **AOT})(x).backward()
    assert same(grads(model), grads(eager)) and len(remat.recent_plans()) == 1
    with pytest.raises(torch._dynamo.exc.Unsupported):
        remat.compile(TwoGraphs(), fullgraph=True, memory_budget=0.0, **AOT)(torch.randn(64, 128))
    assert len(remat.recent_plans()) == 1


def saved_activation_bytes(step, model, x) -> int:
    """Bytes of activations the compiled forward hands to backward, counted as autograd packs them (parameters and
    the input it also saves are left out, as a Plan's saved_bytes leaves them out)."""
    inputs = {p.data_ptr() for p in model.parameters()} | {x.data_ptr()}
    packed = []

    def pack(t):
        if t.data_ptr() not in inputs:
            packed.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step(x)
    loss.backward()
    return sum(packed)


def test_second_compile_with_another_budget_keeps_its_own_plan():
    model = net(width=256)
    x = torch.randn(64, 32)
    full = torch.compile(model, backend="remat", options={"memory_budget": None, **AOT})
    least = torch.compile(model, backend="remat", options={"memory_budget": 0.0, **AOT})
    first = saved_activation_bytes(full, model, x)
    low = saved_activation_bytes(least, model, x)
    again = saved_activation_bytes(full, model, x)  # cached: no recompile, and still its own plan
    plan_full, plan_least = remat.recent_plans()
    assert plan_full.budget_bytes is None and plan_least.budget_bytes == plan_least.least_peak_bytes
    assert plan_least.peak_bytes < plan_full.peak_bytes
    assert (first, low, again) == (plan_full.saved_bytes, plan_least.saved_bytes, plan_full.saved_bytes)
    assert first > low
