import pytest
import torch

from remat.measure import _excluded_allocations, _infer_device, _replay, peak_memory
from remat.units import MIB as MiB

N = 512 * 512  # float32 elements in 1 MiB
SLACK = 64 * 1024  # room for small bookkeeping tensors (wrapped scalars, autograd seeds), far below 1 MiB


def near(measured, expected):
    return expected <= measured < expected + SLACK


def test_two_kept_allocations():
    def fn():
        a = torch.empty(N)
        b = torch.empty(N)
        return a, b

    peak = peak_memory(fn)
    assert isinstance(peak, int)
    assert near(peak, 2 * MiB)


def test_free_then_allocate_reuses_budget():
    def fn():
        a = torch.empty(N)
        del a
        return torch.empty(N)

    assert near(peak_memory(fn), MiB)


def test_transient_counts_even_when_freed():
    def fn():
        a = torch.ones(N)
        b = a * 2  # a and b live together
        del a, b
        return torch.empty(N // 4)

    assert near(peak_memory(fn), 2 * MiB)


def test_freeing_memory_from_before_the_call_does_not_hide_later_allocations():
    holder = [torch.empty(N)]

    def fn(held):
        held.clear()  # frees 1 MiB allocated before the window
        return torch.empty(N)

    assert near(peak_memory(fn, holder), MiB)
    assert holder == []


def test_args_and_kwargs_are_passed():
    def fn(n, *, times):
        return [torch.empty(n) for _ in range(times)]

    assert near(peak_memory(fn, N, times=3), 3 * MiB)


def test_exclude_leaves_out_the_named_tensor():
    kept = []

    def fn():
        kept.append(torch.empty(N))
        scratch = torch.ones(N)  # 2 MiB live here, 1 MiB of it excluded
        return scratch.sum()

    assert near(peak_memory(fn, exclude=lambda: kept), MiB)
    kept.clear()
    assert near(peak_memory(fn), 2 * MiB)
    kept.clear()
    assert near(peak_memory(fn, exclude=lambda: [None, *kept]), MiB)  # None entries are skipped


def test_exclude_linear_training_step_grads():
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    x = torch.randn(512, 512)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def step():
        model(x).sum().backward()

    model.zero_grad(set_to_none=True)
    full = peak_memory(step)
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=True)
    without_grads = peak_memory(step, exclude=lambda: [p.grad for p in model.parameters()])
    # The backward peak holds the 1 MiB output gradient, the 1 MiB weight gradient and the bias gradient; leaving the
    # gradients out leaves the 1 MiB activation (or the 1 MiB temporary) as the peak.
    assert near(full, 2 * MiB)
    assert near(without_grads, MiB)
    assert grad_bytes - 4 * 1024 <= full - without_grads <= grad_bytes


def test_replay_ignores_frees_from_before_the_window():
    # (time, address, bytes): a free of address 9 (allocated before the window) must not lower the running sum.
    events = [(0, 1, 100), (1, 9, -1000), (2, 2, 50), (3, 1, -100), (4, 3, 70)]
    assert _replay(events, set()) == 150
    assert _replay([(0, 9, -1000)], set()) == 0


def test_replay_counts_an_address_once_when_its_free_went_unseen():
    # Address 1 is allocated again with no free recorded in between (freed on a thread the profiler missed): the
    # first block is gone by then, so the running sum holds 300 + 40, not 100 + 300 + 40.
    events = [(0, 1, 100), (1, 2, 40), (2, 1, 300), (3, 3, 10), (4, 1, -300)]
    assert _replay(events, set()) == 350
    # the same when the new allocation at that address is an excluded one
    assert _replay(events, {2}) == 140


def test_exclude_drops_only_the_last_allocation_at_an_address():
    # Address 1 is used twice: the first allocation (freed) counts, the last one (the excluded tensor) does not.
    events = [(0, 1, 100), (1, 2, 40), (2, 1, -100), (3, 1, 300), (4, 2, -40), (5, 3, 10)]
    excluded = _excluded_allocations(events, [_FakeTensor(1)])
    assert excluded == {3}
    assert _replay(events, excluded) == 140
    assert _replay(events, set()) == 340


class _FakeTensor:
    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address

    def untyped_storage(self):
        return self


def test_device_inference_is_cpu_here():
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    assert _infer_device(model, (x,), {}) == torch.device("cpu")
    assert _infer_device(model.forward, ([x, {"y": x}],), {"z": (x,)}) == torch.device("cpu")
    assert _infer_device(lambda: None, (), {}) == torch.device("cpu")
    # Tensors on another device (meta stands in for CUDA, which this machine lacks) do not select CUDA.
    assert _infer_device(torch.nn.Linear(4, 4, device="meta"), (), {}) == torch.device("cpu")


def test_explicit_device():
    assert near(peak_memory(lambda: torch.empty(N), device="cpu"), MiB)
    with pytest.raises(ValueError, match=r"device='meta': peak_memory measures 'cpu' or 'cuda'"):
        peak_memory(lambda: None, device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak():
    def fn():
        a = torch.empty(N, device="cuda")
        b = torch.empty(N, device="cuda")
        del a
        return b

    assert _infer_device(fn, (torch.empty(1, device="cuda"),), {}) == torch.device("cuda")
    assert peak_memory(fn, device="cuda") == 2 * MiB


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_exclude_replays_the_allocators_events():
    kept = []

    def fn():
        kept.append(torch.empty(N, device="cuda"))
        scratch = torch.ones(N, device="cuda")  # 2 MiB live here, 1 MiB of it excluded
        return scratch.sum()

    assert near(peak_memory(fn, device="cuda", exclude=lambda: kept), MiB)
    kept.clear()
    # nothing excluded: the replayed trace agrees with the allocator's own peak statistic (1 MiB kept, 1 MiB scratch,
    # the sum and its scratch in 512-byte blocks)
    replayed = peak_memory(fn, device="cuda", exclude=list)
    assert replayed == peak_memory(fn, device="cuda")
    assert near(replayed, 2 * MiB)
    # a CPU allocation inside the call is not a CUDA one
    assert peak_memory(lambda: (torch.empty(N), torch.empty(N, device="cuda")), device="cuda", exclude=list) == MiB
    assert near(peak_memory(lambda: (torch.empty(N), torch.empty(N, device="cuda")), device="cpu"), MiB)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_exclude_sees_the_backward_threads_frees():
    # A CUDA backward runs on autograd's device thread; its frees are in the allocator's trace, so the replay with
    # nothing excluded equals the allocator's own peak, and leaving the weight gradients out lowers it by at most them.
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).cuda()
    x = torch.randn(512, 512, device="cuda")

    def step():
        out = x
        for layer in layers:
            out = checkpoint(lambda t, layer=layer: torch.relu(layer(t)), out, use_reentrant=False)
        out.sum().backward()

    def no_grads():
        for p in layers.parameters():
            p.grad = None

    step()
    no_grads()
    allocator = peak_memory(step, device="cuda")
    no_grads()
    replayed = peak_memory(step, device="cuda", exclude=list)
    assert allocator - SLACK < replayed <= allocator  # a cached block handed out whole counts at the request's size
    no_grads()
    without = peak_memory(step, device="cuda", exclude=lambda: [p.grad for p in layers.parameters()])
    grad_bytes = sum(p.numel() * p.element_size() for p in layers.parameters())
    assert allocator - grad_bytes <= without <= allocator


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_users_memory_history_left_alone():
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")
    try:
        before = len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])
        assert near(peak_memory(lambda: torch.empty(N, device="cuda"), device="cuda", exclude=list), MiB)
        assert torch._C._cuda_isHistoryEnabled()
        after = len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])
        assert after > before  # still recording, nothing cleared
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def test_cuda_reads_the_allocators_trace_only_where_it_keeps_one(monkeypatch):
    from remat import measure

    assert not measure._reads_allocator_trace(torch.device("cpu"))
    recording = [False]
    monkeypatch.setattr(measure._torch, "cuda_history_recording", lambda: recording[0])
    for backend, recorded, reads in (
        ("native", False, True),
        ("native", True, False),
        ("cudaMallocAsync", False, False),
    ):
        monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda backend=backend: backend)
        recording[0] = recorded
        assert measure._reads_allocator_trace(torch.device("cuda")) is reads, (backend, recorded)


@pytest.mark.inductor
def test_inductor_compiled_allocations():
    x = torch.randn(512, 512)

    def fused(x):
        return ((x + 1) * 2).sum()

    def two_outputs(x):
        return x + 1, x * 2

    compiled_fused, compiled_two = torch.compile(fused), torch.compile(two_outputs)
    compiled_fused(x), compiled_two(x)  # compile outside the measured call
    # Eager materializes x + 1 and its product (2 MiB); inductor fuses them into one reduction kernel.
    assert near(peak_memory(fused, x), 2 * MiB)
    assert peak_memory(compiled_fused, x) < 1024
    # Inductor allocates exactly its two 1 MiB output buffers.
    assert peak_memory(compiled_two, x) == 2 * MiB


def test_an_arena_taken_from_the_pool_counts_for_the_whole_call():
    from remat.runtime.buffers import POOL

    POOL.clear()
    key, cpu = -(1 << 40), torch.device("cpu")
    POOL.reserve(key, cpu, 2 * MiB, count=1)  # allocated before the call, held by the pool between steps
    x = torch.randn(N)
    kept = []

    def step():
        kept[:] = [torch.ops.remat.arena_store(x, key, 2), torch.ops.remat.arena_store(x, key, 2)]

    try:
        assert near(peak_memory(step), 2 * MiB)  # the arena; the stores allocate nothing
        # the first step's values still use the arena: the pool allocates another, counted once as an allocation
        assert near(peak_memory(step), 2 * MiB)
        assert POOL.stats.allocations == 2
        assert near(peak_memory(lambda: torch.empty(N)), MiB)  # a call that takes no arena is not charged one
    finally:
        kept.clear()
        POOL.clear()
