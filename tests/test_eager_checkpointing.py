"""remat.checkpointing, the DeepSpeed-compatible module, in one process (the 2-rank tests are in
test_eager_distributed.py)."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from torch import nn

import remat
from remat import checkpointing
from remat.eager import checkpointing as impl
from remat.eager import region
from remat.runtime import buffers, profile, rng

from eager_models import TwoInThreeOut, assert_bitwise, fresh_checkpointing_state, grads, recompute_log, twin


@pytest.fixture(autouse=True)
def fresh_checkpointing():
    """Each test starts unconfigured, with an empty tracker and no idle arenas, and leaves it so."""
    with fresh_checkpointing_state():
        yield


class FakeMPU:
    def __init__(self, rank=0, world=1):
        self.rank, self.world = rank, world

    def get_model_parallel_rank(self):
        return self.rank

    def get_model_parallel_world_size(self):
        return self.world

    def get_model_parallel_group(self):
        return None


class Layers(nn.Module):
    """`n` Linear+tanh layers, each run through checkpointing.checkpoint (as Megatron-style models do)."""

    def __init__(self, n=4, width=16, dropout=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Dropout(dropout)) for _ in range(n)
        )
        self.checkpointed = True

    def forward(self, x):
        for layer in self.layers:
            x = checkpointing.checkpoint(layer, x) if self.checkpointed else layer(x)
        return x


def _step(model, x):
    model.zero_grad()
    torch.manual_seed(5)
    out = model(x)
    out.square().sum().backward()
    return out.detach(), grads(model)


def _reference(model, x):
    ref = twin(model)
    ref.checkpointed = False
    return _step(ref, x)


def test_module_alias():
    import remat.checkpointing as alias

    assert alias is checkpointing is impl and remat.checkpointing is impl
    assert checkpointing.CudaRNGStatesTracker is rng.RNGStatesTracker


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"checkpoint_in_cpu": True},
        {"contiguous_checkpointing": True},
        {"checkpoint_in_cpu": True, "contiguous_checkpointing": True},
    ],
)
def test_parity_two_inputs_three_outputs(options, mask_kind):
    checkpointing.configure(None, **options)
    torch.manual_seed(0)
    model = TwoInThreeOut()
    ref = twin(model)
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    mask = {None: None, "bool": torch.rand(4, 8) > 0.5, "float": torch.rand(4, 8)}[mask_kind]
    c, a, b = ref(x, y, mask)
    (a + 2 * b + 3 * c).sum().backward()
    want = grads(ref) + [x.grad.clone(), y.grad.clone()]
    x.grad = y.grad = None
    c, a, b = checkpointing.checkpoint(model, x, y, mask)
    (a + 2 * b + 3 * c).sum().backward()
    assert_bitwise(grads(model) + [x.grad, y.grad], want)


def test_checkpoint_function_apply_collects_outputs():
    model = TwoInThreeOut()
    x, y = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8)
    outputs: list = []
    returned = checkpointing.CheckpointFunction.apply(model, outputs, x, y)
    assert len(outputs) == 3 and all(o is r for o, r in zip(outputs, returned))


def test_configure_reads_deepspeed_config_and_arguments_override(tmp_path):
    config = {
        "train_batch_size": 8,
        "activation_checkpointing": {
            "partition_activations": False,
            "cpu_checkpointing": True,
            "contiguous_memory_optimization": True,
            "number_checkpoints": 4,
            "synchronize_checkpoint_boundary": True,
            "profile": True,
        },
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    assert not checkpointing.is_configured()
    for source in (config, str(path), path):
        checkpointing.configure(None, deepspeed_config=source, checkpoint_in_cpu=False, num_checkpoints=2)
        s = impl._settings
        assert (s.checkpoint_in_cpu, s.contiguous_checkpointing, s.num_checkpoints, s.synchronize, s.profile) == (
            False,
            True,
            2,
            True,
            True,
        )
    assert checkpointing.is_configured() and checkpointing.get_profile() is not None
    checkpointing.configure(None)
    assert impl._settings == impl.Settings() and checkpointing.get_profile() is None


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"num_checkpoints": 0}, ValueError, ["num_checkpoints=0", "positive int"]),
        ({"num_checkpoints": -3}, ValueError, ["num_checkpoints=-3"]),
        ({"num_checkpoints": 2.0}, ValueError, ["num_checkpoints=2.0"]),
        ({"num_checkpoints": True}, ValueError, ["num_checkpoints=True"]),
        (
            {"deepspeed_config": "/no/such/ds_config.json"},
            ValueError,
            ["deepspeed_config='/no/such/ds_config.json'", "no such file"],
        ),
        (
            {"deepspeed_config": {"activation_checkpointing": {"cpu_checkpoint": True}}},
            ValueError,
            ["unknown key 'cpu_checkpoint'", "cpu_checkpointing"],
        ),
        ({"deepspeed_config": 3}, TypeError, ["deepspeed_config=3"]),
        ({"checkpoint_in_cpu": "yes"}, TypeError, ["checkpoint_in_cpu='yes'"]),
        ({"mpu_": object()}, TypeError, ["mpu_=", "get_model_parallel_rank"]),
    ],
)
def test_configure_errors_name_the_argument(kwargs, error, words):
    with pytest.raises(error) as info:
        checkpointing.configure(**kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_unknown_key_in_config_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"activation_checkpointing": {"partition_activation": True}}))
    with pytest.raises(ValueError, match="unknown key 'partition_activation'.*did you mean 'partition_activations'"):
        checkpointing.configure(None, deepspeed_config=str(path))


def test_checkpoint_of_a_non_callable():
    with pytest.raises(TypeError, match="function=3"):
        checkpointing.checkpoint(3, torch.ones(1))


def test_offload_keeps_every_saved_tensor_on_host():
    checkpointing.configure(None, checkpoint_in_cpu=True, profile=True)
    model = Layers()
    x = torch.randn(4, 16, requires_grad=True)
    h = x * 1.0  # the first layer's input: after forward only its region refers to it
    alive = weakref.ref(h)
    out = model(h)
    del h
    regions = region.live_regions()
    assert len(regions) == 4
    for r in regions:
        kept = r.stash.kept_tensors()
        assert kept and all(t.device.type == "cpu" and not t.requires_grad for t in kept)
    del regions, r
    # The regions hold host copies, not the device activations: the first input is already freed.
    assert alive() is None
    step = checkpointing.get_profile().steps[-1]
    assert step.calls["offload"] == 4 and step.bytes["offload"] == 4 * 4 * 16 * 4
    out.sum().backward()
    step = checkpointing.get_profile().steps[-1]
    assert step.calls["reload"] == 4 and step.calls["recompute"] == 4 and region.live_regions() == []


def test_plain_checkpoint_keeps_its_input():
    checkpointing.configure(None)
    model = Layers()
    h = torch.randn(4, 16, requires_grad=True) * 1.0
    alive = weakref.ref(h)
    out = model(h)
    del h
    assert alive() is not None
    out.sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device memory after forward is measurable on CUDA only")
def test_offload_lowers_device_memory_after_forward():
    after = {}
    for offload in (False, True):
        checkpointing.configure(None, checkpoint_in_cpu=offload)
        model = Layers(n=8, width=1024).cuda()
        h = torch.randn(4096, 1024, device="cuda", requires_grad=True) * 1.0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        out = model(h)
        del h
        torch.cuda.synchronize()
        after[offload] = torch.cuda.memory_allocated() - base
        out.sum().backward()
    assert after[True] < after[False]


def test_dropout_with_tracker_fork_parity():
    checkpointing.configure(FakeMPU(0, 1))
    checkpointing.model_parallel_cuda_manual_seed(123)

    class ForkedDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            with checkpointing.get_cuda_rng_tracker().fork():
                x = nn.functional.dropout(self.lin(x), 0.5)
            return nn.functional.dropout(x, 0.3)

    torch.manual_seed(0)
    model = ForkedDropout()
    ref = twin(model)
    x = torch.randn(4, 16, requires_grad=True)
    states = rng.TRACKER.get_states()
    torch.manual_seed(9)
    ref(x).sum().backward()
    want = grads(ref) + [x.grad.clone()]
    x.grad = None
    rng.TRACKER.set_states(states)
    torch.manual_seed(9)
    checkpointing.checkpoint(model, x).sum().backward()
    assert_bitwise(grads(model) + [x.grad], want)


def _arena_allocations():
    return buffers.POOL.stats.allocations


def test_contiguous_learns_buffer_count_and_reuses_over_steps(monkeypatch):
    checkpointing.configure(None, contiguous_checkpointing=True)
    model = Layers()
    x = torch.randn(4, 16, requires_grad=True)
    want = _reference(model, x)
    start, reuses = _arena_allocations(), buffers.POOL.stats.reuses
    for step in range(3):
        got = _step(model, x)
        assert_bitwise([got[0]] + got[1], [want[0]] + want[1])
        assert _arena_allocations() - start == 4, "the first step learns the count; later steps allocate nothing"
        assert buffers.POOL.stats.reuses - reuses == 4 * step


def test_contiguous_keeps_inputs_in_arenas():
    checkpointing.configure(None, contiguous_checkpointing=True)
    model = Layers()
    out = model(torch.randn(4, 16, requires_grad=True))
    arenas = [b for held in buffers.POOL._buffers.values() for b in held]
    regions = region.live_regions()
    assert len(regions) == 4
    for r in regions:
        (kept,) = r.stash.kept_tensors()
        assert any(kept.untyped_storage().data_ptr() == a.untyped_storage().data_ptr() for a in arenas)
    del regions, r
    out.sum().backward()


def test_num_checkpoints_allocates_up_front_and_more_checkpoints_grow_the_pool():
    checkpointing.configure(None, contiguous_checkpointing=True, num_checkpoints=2)
    model = Layers(n=4)
    x = torch.randn(4, 16, requires_grad=True)
    want = _reference(model, x)
    start = _arena_allocations()
    checkpointing.checkpoint(model.layers[0], x * 1.0)
    assert _arena_allocations() - start == 2, "num_checkpoints arenas are allocated with the first checkpoint"
    for _ in range(2):
        got = _step(model, x)  # four checkpoints, two buffers: the pool grows instead of raising IndexError
        assert_bitwise(got[1], want[1])
        assert _arena_allocations() - start == 4


def test_eval_forwards_without_backward_then_reset_and_train():
    checkpointing.configure(FakeMPU(0, 1), partition_activations=True, contiguous_checkpointing=True, num_checkpoints=4)
    model = Layers(dropout=0.1)
    x = torch.randn(4, 16, requires_grad=True)
    want = _reference(model, x)
    model.eval()
    kept = [model(x) for _ in range(3)]  # evaluation with grad enabled: regions wait for a backward never run
    assert len(region.live_regions()) == 12
    del kept
    checkpointing.reset()
    model.train()
    for _ in range(2):
        got = _step(model, x)
        assert_bitwise([got[0]] + got[1], [want[0]] + want[1])


def test_profile_records_each_step():
    checkpointing.configure(None, profile=True, checkpoint_in_cpu=True, contiguous_checkpointing=True)
    model = Layers()
    x = torch.randn(4, 16, requires_grad=True)
    for _ in range(2):
        _step(model, x)
    steps = checkpointing.get_profile().steps
    assert len(steps) == 2
    for step in steps:
        assert step.calls == {"recompute": 4, "offload": 4, "reload": 4, "shard": 0, "gather": 0, "pack": 4}
        assert step.bytes["offload"] == step.bytes["pack"] == 4 * 4 * 16 * 4
        assert step.seconds["recompute"] > 0


def test_synchronize_waits_around_forward_and_recompute(monkeypatch):
    waits = []
    monkeypatch.setattr(profile, "synchronize", lambda device: waits.append(torch.device(device).type))
    checkpointing.configure(None, synchronize=True)
    model = Layers(n=2)
    out = model(torch.randn(2, 16, requires_grad=True))
    assert waits == ["cpu"] * 4  # start and end of each checkpoint's forward
    out.sum().backward()
    assert waits == ["cpu"] * 8


def test_works_unconfigured_and_after_reset():
    model = Layers(n=2)
    x = torch.randn(2, 16, requires_grad=True)
    want = _reference(model, x)
    checkpointing.reset()
    assert_bitwise(_step(model, x)[1], want[1])


def test_recompute_count_per_layer(monkeypatch):
    runs = recompute_log(monkeypatch)
    model = Layers(n=3)
    _step(model, torch.randn(2, 16, requires_grad=True))
    assert len(runs) == 3


# --- RNG tracker -------------------------------------------------------------------------------------------------


def test_tracker_duplicate_seed_or_name_raises():
    tracker = checkpointing.CudaRNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(ValueError, match="seed 1 is already used"):
        tracker.add("b", 1)
    with pytest.raises(ValueError, match="'a' already exists"):
        tracker.add("a", 2)


def test_tracker_fork_of_unknown_name_raises():
    tracker = checkpointing.CudaRNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(ValueError, match="fork\\(name='b'\\).*streams: 'a'"):
        with tracker.fork("b"):
            pass


def test_tracker_fork_restores_default_state_and_streams_continue():
    tracker = checkpointing.CudaRNGStatesTracker(device="cpu")
    tracker.add("a", 11)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with tracker.fork("a"):
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    with tracker.fork("a"):
        second = torch.rand(4)
    gen = torch.Generator().manual_seed(11)
    assert torch.equal(torch.cat([first, second]), torch.rand(8, generator=gen))


def test_tracker_nested_forks_equal_sequential_ones():
    def streams(nested: bool):
        tracker = checkpointing.CudaRNGStatesTracker(device="cpu")
        tracker.add("a", 1)
        tracker.add("b", 2)
        torch.manual_seed(0)
        if nested:
            with tracker.fork("a"):
                a1 = torch.rand(3)
                with tracker.fork("b"):
                    b1 = torch.rand(3)
                a2 = torch.rand(3)
        else:
            with tracker.fork("a"):
                a1 = torch.rand(3)
                a2 = torch.rand(3)
            with tracker.fork("b"):
                b1 = torch.rand(3)
        return [a1, a2, b1, torch.rand(3)]

    assert_bitwise(streams(True), streams(False))


def test_tracker_states_round_trip_and_reset():
    tracker = checkpointing.CudaRNGStatesTracker(device="cpu")
    tracker.add("a", 1)
    states = tracker.get_states()
    with tracker.fork("a"):
        x = torch.rand(2)
    tracker.set_states(states)
    with tracker.fork("a"):
        assert torch.equal(torch.rand(2), x)
    tracker.reset()
    assert tracker.get_states() == {}
    tracker.add("a", 1)  # the seed is free again


def test_model_parallel_seed_differs_per_rank():
    draws = {}
    for rank in (0, 1, 0):
        checkpointing.configure(FakeMPU(rank, 2))
        checkpointing.model_parallel_cuda_manual_seed(1234)
        device = checkpointing.get_cuda_rng_tracker().device  # the CUDA device where there is one, as in DeepSpeed
        with checkpointing.get_cuda_rng_tracker().fork():
            parallel = torch.rand(8, device=device)
        default = torch.rand(8, device=device)
        if rank in draws:
            assert torch.equal(draws[rank][0], parallel)
        draws[rank] = (parallel, default)
    assert not torch.equal(draws[0][0], draws[1][0]), "model-parallel ranks draw different streams"
    assert torch.equal(draws[0][1], draws[1][1]), "the default stream is the same on every model-parallel rank"
    with pytest.raises(TypeError, match="seed='1'"):
        checkpointing.model_parallel_cuda_manual_seed("1")


# --- the rest of deepspeed.checkpointing's surface ------------------------------------------------------------------


class TensorParallelMPU:
    """A Megatron-style mpu: only the tensor-model-parallel method names."""

    def __init__(self, rank=0, world=1):
        self.rank, self.world = rank, world

    def get_tensor_model_parallel_rank(self):
        return self.rank

    def get_tensor_model_parallel_world_size(self):
        return self.world

    def get_tensor_model_parallel_group(self):
        return None


@pytest.mark.parametrize("source", ["argument", "config"])
def test_partition_without_mpu_is_one_partition(source):
    """DeepSpeed accepts partition_activations without an mpu (no model parallelism): the whole input is kept."""
    if source == "argument":
        checkpointing.configure(mpu_=None, partition_activations=True)
    else:
        checkpointing.configure(None, deepspeed_config={"activation_checkpointing": {"partition_activations": True}})
    assert checkpointing.get_settings().partition_activations is True
    model = Layers(n=2)
    x = torch.randn(4, 16, requires_grad=True)
    want = _reference(model, x)
    out = model(x * 1.0)
    kept = [t for r in region.live_regions() for t in r.stash.kept_tensors()]
    assert [tuple(t.shape) for t in kept] == [(4, 16), (4, 16)]
    del out
    assert_bitwise(_step(model, x)[1], want[1])


def test_checkpoint_passes_keyword_arguments_through():
    torch.manual_seed(0)
    model = TwoInThreeOut()
    ref = twin(model)
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    mask = torch.rand(4, 8)
    c, a, b = ref(x, y, mask=mask)
    (a + 2 * b + 3 * c).sum().backward()
    want = grads(ref) + [x.grad.clone(), y.grad.clone()]
    x.grad = y.grad = None
    c, a, b = checkpointing.checkpoint(model, x, y=y, mask=mask)  # y, a tensor needing grad, passed by keyword
    (a + 2 * b + 3 * c).sum().backward()
    assert_bitwise(grads(model) + [x.grad, y.grad], want)


def test_non_reentrant_checkpoint_grads_flow_to_parameters_when_no_input_requires_grad(monkeypatch):
    runs = recompute_log(monkeypatch)
    model = Layers(n=1)
    ref = twin(model)
    x = torch.randn(4, 16)  # no input requires grad: only the parameters do
    ref.layers[0](x).square().sum().backward()
    out = checkpointing.non_reentrant_checkpoint(model.layers[0], x)
    out.square().sum().backward()
    assert len(runs) == 1
    assert_bitwise(grads(model), grads(ref))
    with pytest.raises(TypeError, match="non_reentrant_checkpoint\\(function=3\\)"):
        checkpointing.non_reentrant_checkpoint(3, x)


def test_set_num_layers_and_partition_flag_keep_other_settings_and_do_not_configure():
    checkpointing.set_num_layers(3)
    checkpointing.partition_activations_in_checkpoint(True)
    assert not checkpointing.is_configured()
    assert checkpointing.get_settings() == impl.Settings(num_checkpoints=3, partition_activations=True)
    checkpointing.configure(None, checkpoint_in_cpu=True, contiguous_checkpointing=True)
    assert checkpointing.is_configured()
    checkpointing.set_num_layers(2)
    checkpointing.partition_activations_in_checkpoint(False)
    assert checkpointing.get_settings() == impl.Settings(
        checkpoint_in_cpu=True, contiguous_checkpointing=True, num_checkpoints=2
    )
    assert impl._reserve == 2, "the next step allocates the two arenas up front"
    for bad, error in ((0, ValueError), (True, ValueError), (2.0, ValueError)):
        with pytest.raises(error, match=f"set_num_layers\\(nlayers={bad!r}\\): expected a positive int"):
            checkpointing.set_num_layers(bad)
    with pytest.raises(TypeError, match="partition_activation=1\\): expected True or False"):
        checkpointing.partition_activations_in_checkpoint(1)


def test_reconfigure_tp_seed_reseeds_only_the_model_parallel_stream():
    checkpointing.configure(FakeMPU(1, 2))
    checkpointing.model_parallel_cuda_manual_seed(1234)
    device = checkpointing.get_cuda_rng_tracker().device
    torch.manual_seed(7)
    default_before = rng.get_state(device)
    checkpointing.model_parallel_reconfigure_tp_seed(99)
    assert torch.equal(rng.get_state(device), default_before), "the default stream is untouched"
    with checkpointing.get_cuda_rng_tracker().fork():
        got = torch.rand(8, device=device)
    want = torch.rand(8, device=device, generator=torch.Generator(device).manual_seed(99 + 2718 + 1))
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match="reconfigure_tp_seed\\(seed=1.5\\)"):
        checkpointing.model_parallel_reconfigure_tp_seed(1.5)
    checkpointing.get_cuda_rng_tracker().reset()
    with pytest.raises(ValueError, match="call model_parallel_cuda_manual_seed\\(seed\\) first"):
        checkpointing.model_parallel_reconfigure_tp_seed(99)


def test_tensor_model_parallel_mpu_is_used_for_seeds():
    checkpointing.configure(TensorParallelMPU(rank=3, world=4))
    checkpointing.model_parallel_cuda_manual_seed(10)
    device = checkpointing.get_cuda_rng_tracker().device
    with checkpointing.get_cuda_rng_tracker().fork():
        got = torch.rand(4, device=device)
    assert torch.equal(got, torch.rand(4, device=device, generator=torch.Generator(device).manual_seed(10 + 2718 + 3)))


def test_detach_variable_keeps_requires_grad_and_passes_others():
    a, b = torch.ones(2, requires_grad=True), torch.zeros(2)
    out = checkpointing.detach_variable((a, 3, b))
    assert out[1] == 3 and out[0].requires_grad and not out[2].requires_grad
    assert out[0].grad_fn is None and out[0].data_ptr() == a.data_ptr()
    with pytest.raises(TypeError, match="detach_variable\\(inputs=list\\): expected a tuple"):
        checkpointing.detach_variable([a])


def test_deepspeed_private_names_megatron_imports():
    assert checkpointing._MODEL_PARALLEL_RNG_TRACKER_NAME == "model-parallel-rng"
    assert checkpointing._CUDA_RNG_STATE_TRACKER is checkpointing.get_cuda_rng_tracker()
    torch.manual_seed(3)
    state = torch.get_rng_state()
    first = torch.rand(3)
    checkpointing._set_cuda_rng_state(state, "cpu")
    assert torch.equal(torch.rand(3), first)


@pytest.mark.parametrize(
    "name, words",
    [
        ("get_partition_size", "configure(mpu_, partition_activations=True)"),
        ("restore_offloaded_activations", "configure(checkpoint_in_cpu=True)"),
        ("merge_tensors", "checkpoint(fn, *args, **kwargs)"),
        ("PARTITION_ACTIVATIONS", "get_settings()"),
        ("num_layers", "set_num_layers(n)"),
    ],
)
def test_deepspeed_names_not_offered_say_what_to_use(name, words):
    with pytest.raises(AttributeError) as info:
        getattr(checkpointing, name)
    assert f"DeepSpeed's {name} is not offered" in str(info.value) and words in str(info.value)
    assert not hasattr(checkpointing, "no_such_name")


def test_every_public_deepspeed_function_is_offered():
    """The callables of deepspeed.checkpointing a model uses (its documented API and Megatron's calls)."""
    names = [
        "configure",
        "is_configured",
        "checkpoint",
        "non_reentrant_checkpoint",
        "CheckpointFunction",
        "reset",
        "get_cuda_rng_tracker",
        "model_parallel_cuda_manual_seed",
        "model_parallel_reconfigure_tp_seed",
        "set_num_layers",
        "partition_activations_in_checkpoint",
        "CudaRNGStatesTracker",
        "detach_variable",
    ]
    assert [n for n in names if not callable(getattr(checkpointing, n))] == []
    assert set(names) <= set(checkpointing.__all__)
