"""smp, FairScale and modalities checkpointing APIs in eager mode: parity, recompute counts, arguments, errors."""

from __future__ import annotations

import dataclasses
import enum
import gc
import weakref

import pytest
import torch
from torch import nn

import remat
from remat.eager import region
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from eager_models import Counted, TwoInThreeOut, assert_bitwise, grads, recompute_log, twin


def _two_in_three_out_loss(model, x, y, mask, wrap):
    outs = wrap(model, x, y, mask)
    c, a, b = outs
    return (a * 1.0 + b * 2.0 + c * 3.0).sum()


WRAPS = {
    "checkpoint": lambda m, *a: remat.checkpoint(m, *a),
    "checkpoint_kwargs": lambda m, x, y, mask: remat.checkpoint(m, x, y=y, mask=mask),
    "wrapper": lambda m, *a: remat.checkpoint_wrapper(m)(*a),
    "wrapper_offload": lambda m, *a: remat.checkpoint_wrapper(m, offload_to_cpu=True)(*a),
    "set_activation_checkpointing": lambda m, *a: remat.set_activation_checkpointing(m)(*a),
}


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("api", sorted(WRAPS))
def test_two_inputs_three_outputs_bitwise(api, mask_kind):
    torch.manual_seed(0)
    model = TwoInThreeOut()
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(4, 8) > 0.5
    elif mask_kind == "float":
        mask = torch.rand(4, 8)
    ref = twin(model)
    _two_in_three_out_loss(ref, x, y, mask, lambda m, *a: m(*a)).backward()
    expected = grads(ref) + [x.grad.clone(), y.grad.clone()]
    x.grad = y.grad = None
    _two_in_three_out_loss(model, x, y, mask, WRAPS[api]).backward()
    assert_bitwise(grads(model) + [x.grad, y.grad], expected)


def _dropout_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 16), nn.Dropout(0.5))


@pytest.mark.parametrize("mode", ["checkpoint", "checkpoint_offload"])
def test_dropout_loss_and_grad_norm_equal(mode):
    x = torch.randn(8, 16)
    results = []
    for variant in ("none", mode):
        model = _dropout_model()
        if variant != "none":
            remat.checkpoint_wrapper(model, offload_to_cpu=variant.endswith("offload"))
        torch.manual_seed(7)
        loss = model(x).square().sum()
        loss.backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        results.append((loss.detach(), norm, torch.get_rng_state()))
    (loss0, norm0, state0), (loss1, norm1, state1) = results
    assert torch.equal(loss0, loss1) and torch.equal(norm0, norm1)
    assert torch.equal(state0, state1), "the generator must end where the unwrapped model leaves it"


def _gpt_run(model, idx, targets):
    torch.manual_seed(3)
    loss = gpt_loss(model, idx, targets)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def gpt_reference():
    config = GPTConfig(n_layer=4, d_model=128, seq_len=256)
    idx, targets = make_gpt_batch(config, batch=2)
    return config, idx, targets, _gpt_run(GPT(config), idx, targets)


@pytest.mark.parametrize(
    "variant, ac_freq, save_ops, recomputed_layers",
    [
        ("full", None, None, [0, 1, 2, 3]),
        ("selective_layer", 2, None, [1, 3]),
        # nn.Linear with a bias dispatches addmm, so "save mm" names both matmul ops.
        ("selective_op", None, ["aten.mm", "aten.addmm"], [0, 1, 2, 3]),
    ],
)
def test_gpt_parity_modalities(gpt_reference, monkeypatch, variant, ac_freq, save_ops, recomputed_layers):
    config, idx, targets, (ref_loss, ref_grads) = gpt_reference
    model = GPT(config)
    remat.apply_activation_checkpointing(model, variant, "blocks", ac_freq=ac_freq, save_ops=save_ops)
    wrapped = [i for i, block in enumerate(model.blocks) if "forward" in block.__dict__]
    assert wrapped == recomputed_layers
    mm_in_recompute = []
    original = region.Region.recompute

    def counting(self):
        with _OpCounter(torch.ops.aten.mm.default, torch.ops.aten.addmm.default) as counter:
            original(self)
        mm_in_recompute.append(counter.calls)

    monkeypatch.setattr(region.Region, "recompute", counting)
    loss, got = _gpt_run(model, idx, targets)
    assert len(mm_in_recompute) == len(recomputed_layers)
    if variant == "selective_op":
        assert mm_in_recompute == [0] * 4, "saved mm outputs must not be recomputed"
    else:
        assert all(c > 0 for c in mm_in_recompute)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-7)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)


class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, *ops):
        super().__init__()
        self.ops, self.calls = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in self.ops
        return func(*args, **(kwargs or {}))


class Variants(enum.Enum):
    FULL_ACTIVATION_CHECKPOINTING = "full_activation_checkpointing"
    SELECTIVE_LAYER_ACTIVATION_CHECKPOINTING = "selective_layer_activation_checkpointing"
    SELECTIVE_OP_ACTIVATION_CHECKPOINTING = "selective_op_activation_checkpointing"


@pytest.mark.parametrize(
    "variant",
    [
        "FULL_ACTIVATION_CHECKPOINTING",
        "SELECTIVE_LAYER_ACTIVATION_CHECKPOINTING",
        "SELECTIVE_OP_ACTIVATION_CHECKPOINTING",
        *Variants,
    ],
)
def test_variant_enum_names(variant):
    model = nn.Module()
    model.layers = nn.ModuleList(Counted() for _ in range(4))
    remat.apply_activation_checkpointing(model, variant, "layers", ac_freq=2)
    name = variant.name if isinstance(variant, Variants) else variant
    expected = [1, 3] if name.startswith("SELECTIVE_LAYER") else [0, 1, 2, 3]
    assert [i for i, m in enumerate(model.layers) if "forward" in m.__dict__] == expected


def test_save_ops_accepts_names_ops_and_modalities_keys():
    from remat.eager.wrappers import _save_set

    mm = torch.ops.aten.mm.default
    assert (
        _save_set(["aten.mm.default"]) == _save_set(["ops.aten.mm.default"]) == _save_set([mm]) == ("aten.mm.default",)
    )
    assert _save_set("aten.addmm") == ("aten.addmm",)


def _sequential(n=10, log=None):
    torch.manual_seed(0)
    return nn.Sequential(*(Counted(log=log, index=i) for i in range(n)))


def test_checkpoint_sequential_group_2_recomputes_5_regions(monkeypatch):
    model = _sequential()
    runs = recompute_log(monkeypatch)
    ref = twin(model)
    x = torch.randn(4, 8, requires_grad=True)
    remat.checkpoint_sequential(model, x, strategy="group_2").sum().backward()
    assert len(runs) == 5
    assert [child.calls for child in model] == [2] * 10
    ref(x).sum().backward()
    assert_bitwise(grads(model), grads(ref))


@pytest.mark.parametrize(
    "strategy, regions",
    [
        ("each", [[i] for i in reversed(range(10))]),
        ("group_2", [[8, 9], [6, 7], [4, 5], [2, 3], [0, 1]]),
        ("group_3", [[9], [6, 7, 8], [3, 4, 5], [0, 1, 2]]),
        ("contiguous", [list(range(10))]),
    ],
)
@pytest.mark.parametrize("entry", ["checkpoint_sequential", "set_activation_checkpointing"])
def test_smp_strategies_region_sizes(monkeypatch, strategy, regions, entry):
    log: list[int] = []
    model = _sequential(log=log)
    runs = recompute_log(monkeypatch, log)
    x = torch.randn(4, 8, requires_grad=True)
    if entry == "checkpoint_sequential":
        out = remat.checkpoint_sequential(model, x, strategy=strategy)
    else:
        out = remat.set_activation_checkpointing(model, strategy=strategy)(x)
    assert log == list(range(10))
    out.sum().backward()
    assert runs == regions


class Pair(nn.Module):
    def __init__(self, packed: bool):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.packed = packed

    def forward(self, *args):
        a, b = args[0] if self.packed else args
        return torch.tanh(self.lin(a)), b * 2


@pytest.mark.parametrize("packed", [False, True])
def test_pack_args_as_tuple(packed):
    torch.manual_seed(0)
    model = nn.Sequential(Pair(packed), Pair(packed), Pair(packed))
    ref = twin(model)
    a, b = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8, requires_grad=True)
    out = remat.checkpoint_sequential(model, (a, b), strategy="each", pack_args_as_tuple=packed)
    (out[0].sum() + out[1].sum()).backward()
    x = (a, b)
    for child in ref:
        x = child(x) if packed else child(*x)
    (x[0].sum() + x[1].sum()).backward()
    assert_bitwise(grads(model), grads(ref))


def test_set_activation_checkpointing_module_list_each_layer(monkeypatch):
    layers = nn.ModuleList(Counted() for _ in range(3))
    remat.set_activation_checkpointing(layers)
    runs = recompute_log(monkeypatch)
    x = torch.randn(2, 8, requires_grad=True)
    for layer in layers:
        x = layer(x)
    x.sum().backward()
    assert len(runs) == 3 and [layer.calls for layer in layers] == [2, 2, 2]


def test_frozen_module_without_grad_inputs_is_not_recomputed(monkeypatch):
    torch.manual_seed(0)
    frozen, trained = Counted(), Counted()
    frozen.requires_grad_(False)
    runs = recompute_log(monkeypatch)
    x = torch.randn(2, 8)
    with pytest.warns(UserWarning, match="nothing in the checkpointed region requires grad"):
        h = remat.checkpoint(frozen, x)
    remat.checkpoint(trained, h).sum().backward()
    assert frozen.calls == 1 and trained.calls == 2 and len(runs) == 1
    # A frozen module whose input requires grad is recomputed: its input's gradient needs it.
    frozen.calls = 0
    y = torch.randn(2, 8, requires_grad=True)
    remat.checkpoint(frozen, y).sum().backward()
    assert frozen.calls == 2 and y.grad is not None


@dataclasses.dataclass
class Settings:
    gain: float
    tag: str


@dataclasses.dataclass
class Result:
    value: torch.Tensor
    note: str


class Matrix(nn.Module):
    """A forward taking and returning every kind of argument FairScale users pass."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(
        self,
        x,
        flag: bool,
        n: int,
        extra=None,
        *,
        scale: float = 1.0,
        settings: Settings,
        table: dict,
        pair: tuple = (None, 0),
    ):
        h = torch.tanh(self.lin(x)) * scale * settings.gain + self.frozen(x)
        if flag:
            h = h * n
        if extra is not None:
            h = h + extra
        h = h + table["bias"] * pair[1]
        return {
            "out": h,
            "count": n,
            "flag": flag,
            "none": None,
            "mixed": (h.sum(), None, 3, True),
            "result": Result(h.exp(), settings.tag),
        }


def _matrix_loss(out):
    return out["out"].sum() + out["mixed"][0] + out["result"].value.sum()


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("x_grad", [False, True])
@pytest.mark.parametrize("with_extra", [False, True])
@pytest.mark.parametrize("offload", [False, True])
def test_fairscale_kwargs_and_non_tensor_matrix(flag, x_grad, with_extra, offload):
    torch.manual_seed(0)
    model = Matrix()
    ref = twin(model)
    x = torch.randn(3, 8, requires_grad=x_grad)
    extra = torch.randn(3, 8) if with_extra else None
    kwargs = dict(scale=0.5, settings=Settings(1.5, "t"), table={"bias": torch.randn(8)}, pair=(None, 2))
    expected = ref(x, flag, 3, extra, **kwargs)
    _matrix_loss(expected).backward()
    want = grads(ref) + ([x.grad.clone()] if x_grad else [])
    x.grad = None
    remat.checkpoint_wrapper(model, offload_to_cpu=offload)
    out = model(x, flag, 3, extra, **kwargs)
    assert (out["count"], out["flag"], out["none"], out["mixed"][1:]) == (3, flag, None, (None, 3, True))
    assert out["result"].note == "t" and torch.equal(out["out"], expected["out"])
    _matrix_loss(out).backward()
    assert model.frozen.weight.grad is None
    assert_bitwise(grads(model) + ([x.grad] if x_grad else []), want)


def test_keyword_only_arguments_are_required_and_forwarded():
    model = remat.checkpoint_wrapper(Matrix())
    with pytest.raises(TypeError, match="settings"):
        model(torch.randn(2, 8), True, 1, table={"bias": torch.zeros(8)})


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_running_stats_updated_once(momentum):
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=momentum), nn.ReLU(), nn.Linear(8, 4))

    x = torch.randn(16, 8)
    states = []
    for wrap in (False, True):
        model = make()
        if wrap:
            remat.checkpoint_wrapper(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).square().mean().backward()
        opt.step()
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    assert states[1]["1.num_batches_tracked"].item() == 1


def test_third_order_gradients():
    torch.manual_seed(0)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    lin = nn.Linear(5, 5).double()

    def f(t):
        return (torch.sin(lin(t)) * t.exp()).sum()

    def derivatives(fn):
        (g1,) = torch.autograd.grad(fn(x), x, create_graph=True)
        (g2,) = torch.autograd.grad(g1.sum(), x, create_graph=True)
        (g3,) = torch.autograd.grad(g2.sum(), x)
        return [g1, g2, g3]

    assert_bitwise(derivatives(lambda t: remat.checkpoint(f, t)), derivatives(f))


def test_autocast_bf16_dtypes_preserved():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    ref = twin(model)
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = ref(x)
        out = remat.checkpoint_wrapper(model)(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    expected.float().sum().backward()
    want = grads(ref) + [x.grad.clone()]
    x.grad = None
    out.float().sum().backward()
    got = grads(model) + [x.grad]
    assert all(g.dtype == torch.float32 for g in got)
    assert_bitwise(got, want)


def test_no_graph_kept_alive_after_backward():
    model = remat.checkpoint_wrapper(TwoInThreeOut())
    gc.collect()
    gc.disable()  # freed by reference counting alone: no cycle through the region
    try:
        x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
        h = x * 2  # an activation only the region holds after forward
        outs = model(h, y)
        alive = weakref.ref(h)
        del h
        assert len(region.live_regions()) == 1 and alive() is not None
        sum(o.sum() for o in outs).backward()
        del outs
        assert region.live_regions() == [] and alive() is None
    finally:
        gc.enable()


def test_eval_without_grad_runs_once(monkeypatch):
    model = remat.checkpoint_wrapper(Counted())
    runs = recompute_log(monkeypatch)
    with torch.no_grad():
        model(torch.randn(2, 8))
    assert model.calls == 1 and runs == [] and region.live_regions() == []


def _ac_model():
    model = nn.Module()
    model.layers = nn.ModuleList(Counted() for _ in range(2))
    model.head = nn.Linear(8, 8)
    return model


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda m: remat.apply_activation_checkpointing(m, "partial", "layers"), ValueError, ["variant='partial'"]),
        (
            lambda m: remat.apply_activation_checkpointing(m, "full", "head"),
            TypeError,
            ["layers_fqn='head'", "ModuleList"],
        ),
        (lambda m: remat.apply_activation_checkpointing(m, "full", "nope"), ValueError, ["layers_fqn='nope'"]),
        (
            lambda m: remat.apply_activation_checkpointing(m, "selective_layer", "layers", ac_freq=0),
            ValueError,
            ["ac_freq=0"],
        ),
        (
            lambda m: remat.apply_activation_checkpointing(m, "selective_layer", "layers", ac_freq=-2),
            ValueError,
            ["ac_freq=-2"],
        ),
        (lambda m: remat.apply_activation_checkpointing(m, "selective_layer", "layers"), ValueError, ["ac_freq=None"]),
        (
            lambda m: remat.apply_activation_checkpointing(m, "selective_op", "layers", save_ops=[]),
            ValueError,
            ["save_ops=[]"],
        ),
        (
            lambda m: remat.apply_activation_checkpointing(
                m, "selective_op", "layers", save_ops=["aten.nonexistent_op"]
            ),
            ValueError,
            ["save_ops", "aten.nonexistent_op"],
        ),
        (
            lambda m: remat.apply_activation_checkpointing(m, "selective_op", "layers", save_ops=[42]),
            TypeError,
            ["save_ops", "42"],
        ),
        (lambda m: remat.checkpoint_sequential(m.layers, torch.randn(2, 8)), TypeError, ["ModuleList", "Sequential"]),
        (
            lambda m: remat.checkpoint_sequential(nn.Sequential(*m.layers), torch.randn(2, 8), strategy="group_0"),
            ValueError,
            ["strategy='group_0'", "group_N"],
        ),
        (
            lambda m: remat.checkpoint_sequential(nn.Sequential(*m.layers), torch.randn(2, 8), strategy="groups_2"),
            ValueError,
            ["strategy='groups_2'"],
        ),
        (
            lambda m: remat.set_activation_checkpointing(m.layers, strategy="group_2"),
            ValueError,
            ["strategy='group_2'", "ModuleList"],
        ),
        (lambda m: remat.set_activation_checkpointing(m.head, strategy="every"), ValueError, ["strategy='every'"]),
        (lambda m: remat.checkpoint(42, torch.randn(2)), TypeError, ["module_or_fn=42"]),
    ],
)
def test_bad_arguments_name_the_argument(call, error, words):
    with pytest.raises(error) as info:
        call(_ac_model())
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize(
    "value, offload",
    [({}, False), (None, False), (0, False), ([], False), ("yes", True), ({"device": "cpu"}, True), (1, True)],
)
def test_fairscale_offload_to_cpu_is_a_truth_value(value, offload):
    """FairScale tests `if offload_to_cpu`, so any value works and its truth decides."""
    model = remat.checkpoint_wrapper(Counted(), offload_to_cpu=value)
    assert model.forward.spec.offload is offload
    x = torch.randn(2, 8, requires_grad=True)
    model(x).sum().backward()
    assert model.calls == 2


def test_fairscale_maintain_forward_counter_counts_forwards_awaiting_backward():
    model = nn.Sequential(Counted(), nn.Tanh())
    remat.checkpoint_wrapper(model, maintain_forward_counter=True)
    counters = lambda: [m._checkpoint_fwd_counter for m in model.modules()]  # noqa: E731
    assert counters() == [0, 0, 0, 0]  # the Sequential, Counted, its Linear, the Tanh
    x = torch.randn(2, 8, requires_grad=True)
    first, second = model(x), model(x)
    assert counters() == [2, 2, 2, 2]
    first.sum().backward()
    assert counters() == [1, 1, 1, 1]
    second.sum().backward()
    assert counters() == [0, 0, 0, 0]
    with torch.no_grad():
        model(x)
    assert counters() == [0, 0, 0, 0], "a forward without grad has no backward to wait for"
    plain = remat.checkpoint_wrapper(Counted(), maintain_forward_counter=False)
    plain(x).sum().backward()
    assert not any(hasattr(m, "_checkpoint_fwd_counter") for m in plain.modules())


def test_input_modified_in_place_after_forward_is_an_error():
    model = remat.checkpoint_wrapper(Counted())
    x = torch.randn(2, 8, requires_grad=True)
    h = x * 1
    out = model(h)
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_wrapped_module_copies_and_pickles_with_its_wrapping(monkeypatch, tmp_path, how):
    import copy

    model = nn.Sequential(Counted(), Counted())
    remat.checkpoint_wrapper(model[0], offload_to_cpu=True)
    remat.set_activation_checkpointing(model, strategy="contiguous")
    if how == "deepcopy":
        clone = copy.deepcopy(model)
    else:
        torch.save(model, tmp_path / "m.pt")
        clone = torch.load(tmp_path / "m.pt", weights_only=False)
    with torch.no_grad():
        clone[0].lin.weight.add_(1.0)  # the clone's forward must use the clone's weights
    x = torch.randn(2, 8, requires_grad=True)
    runs = recompute_log(monkeypatch)
    out = clone(x)
    fresh = torch.tanh(clone[1].lin(torch.tanh(clone[0].lin(x))))
    assert torch.equal(out, fresh)
    out.sum().backward()
    assert len(runs) == 2  # the contiguous region and the nested wrapped child's region
    assert clone[0].forward.spec.offload and clone.forward.spec.strategy == "contiguous"
    assert model[0].calls == 0


# --- torch's call form of apply_activation_checkpointing ------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Counted()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(self.inner(x))


def _torch_model():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(8, 8))
    return model


def _recording(model, log):
    """A wrapper fn that records the path of each module it is given and wraps it with remat's wrapper."""
    names = {m: n for n, m in model.named_modules()}

    def wrap(module, **kwargs):
        log.append((names[module], kwargs))
        return remat.checkpoint_wrapper(module, **kwargs)

    return wrap


def _checkpointed(model):
    return [n for n, m in model.named_modules() if "forward" in m.__dict__]


def test_torch_form_check_fn_parity_and_one_recompute_per_block(monkeypatch):
    model = _torch_model()
    ref = twin(model)
    out = remat.apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=remat.checkpoint_wrapper, check_fn=lambda m: isinstance(m, Block)
    )
    assert out is model and _checkpointed(model) == ["0", "1"]
    runs = recompute_log(monkeypatch)
    x = torch.randn(4, 8, requires_grad=True)
    model(x).square().sum().backward()
    want_x = x.grad.clone()
    x.grad = None
    ref(x).square().sum().backward()
    assert len(runs) == 2
    assert_bitwise(grads(model) + [want_x], grads(ref) + [x.grad])


@pytest.mark.parametrize("call", ["keywords", "positional", "defaults"])
def test_torch_form_call_shapes(call):
    model = _torch_model()
    if call == "keywords":
        remat.apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.Linear))
        want = ["0.inner.lin", "0.proj", "1.inner.lin", "1.proj", "2"]
    elif call == "positional":
        remat.apply_activation_checkpointing(model, remat.checkpoint_wrapper, lambda m: isinstance(m, Counted))
        want = ["0.inner", "1.inner"]
    else:
        remat.apply_activation_checkpointing(model)  # torch's defaults: every submodule, never the root
        want = [n for n, _ in model.named_modules() if n]
    assert _checkpointed(model) == want


def test_torch_form_replaces_modules_with_what_the_wrapper_returns():
    class Wrapped(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args):
            return self.module(*args)

    model = _torch_model()
    remat.apply_activation_checkpointing(model, checkpoint_wrapper_fn=Wrapped, check_fn=lambda m: isinstance(m, Block))
    assert [type(m).__name__ for m in model] == ["Wrapped", "Wrapped", "Linear"]
    assert isinstance(model[0].module, Block)


def test_torch_form_callable_policy_sees_unwrapped_numel():
    """A policy wrapping what holds >= 72 parameters not yet wrapped: each Linear(8, 8) (72), not the Blocks
    (their 144 are all inside wrapped Linears by then), as torch's walk decides."""
    model = _torch_model()
    asked = []

    def policy(module, recurse, nonwrapped_numel):
        asked.append((type(module).__name__, recurse, nonwrapped_numel))
        return recurse or nonwrapped_numel >= 72

    remat.apply_activation_checkpointing(model, auto_wrap_policy=policy)
    assert _checkpointed(model) == ["0.inner.lin", "0.proj", "1.inner.lin", "1.proj", "2"]
    assert ("Block", False, 0) in asked and ("Sequential", True, 360) in asked
    assert not any(name == "Sequential" and not recurse for name, recurse, _ in asked), "the root is never wrapped"


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("case", ["check_fn", "policy", "module_wrap_policy", "custom_policy"])
def test_torch_form_wraps_what_torch_wraps_in_the_same_order(case):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as torch_apply,
    )
    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

    arguments = {
        "check_fn": {"check_fn": lambda m: isinstance(m, (Block, nn.Linear))},
        "policy": {"auto_wrap_policy": lambda module, recurse, nonwrapped_numel: recurse or nonwrapped_numel >= 72},
        "module_wrap_policy": {"auto_wrap_policy": ModuleWrapPolicy({Block, Counted})},
        "custom_policy": {
            "auto_wrap_policy": CustomPolicy(
                lambda m: {"offload_to_cpu": True} if isinstance(m, Counted) else isinstance(m, Block)
            )
        },
    }[case]
    logs = []
    for apply in (torch_apply, remat.apply_activation_checkpointing):
        model = _torch_model()
        log = []
        apply(model, checkpoint_wrapper_fn=_recording(model, log), **arguments)
        logs.append(log)
    assert logs[0] == logs[1] and len(logs[1]) >= 2


@pytest.mark.parametrize(
    "call, error, words",
    [
        (
            lambda m: remat.apply_activation_checkpointing(m, "full", "layers", check_fn=lambda _: True),
            TypeError,
            ["check_fn (torch's form) cannot be combined with variant='full'"],
        ),
        (
            lambda m: remat.apply_activation_checkpointing(m, layers_fqn="layers"),
            TypeError,
            ["layers_fqn='layers'", "needs variant"],
        ),
        (lambda m: remat.apply_activation_checkpointing(m, "full"), TypeError, ["layers_fqn=None", "variant 'full'"]),
        (lambda m: remat.apply_activation_checkpointing(m, check_fn=3), TypeError, ["check_fn=3"]),
        (lambda m: remat.apply_activation_checkpointing(m, auto_wrap_policy=3), TypeError, ["auto_wrap_policy=3"]),
        (
            lambda m: remat.apply_activation_checkpointing(m, checkpoint_wrapper_fn=3),
            TypeError,
            ["checkpoint_wrapper_fn=3"],
        ),
        (
            lambda m: remat.apply_activation_checkpointing(m, remat.checkpoint_wrapper, check_fn=lambda _: True),
            TypeError,
            ["positionally or by keyword, not both"],
        ),
        (lambda m: remat.apply_activation_checkpointing(3, check_fn=lambda _: True), TypeError, ["model=3"]),
    ],
)
def test_torch_form_errors_name_the_argument(call, error, words):
    with pytest.raises(error) as info:
        call(_ac_model())
    for word in words:
        assert word in str(info.value), (word, str(info.value))
