"""Runtime checkpoint ops in compiled graphs: offload/reload, contiguous arenas, profile, synchronize (CPU)."""

import contextlib
import copy

import pytest
import sympy
import torch

import remat
from remat.runtime import buffers
from remat.units import fmt_bytes
from ranks import TIMEOUT

DEVICE = torch.device("cpu")


class Net(torch.nn.Module):
    def __init__(self, dropout=0.1):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 1)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x):
        return self.c(torch.tanh(self.b(self.drop(torch.nn.functional.gelu(self.a(x)))))).sum()


def step(module, x, seed=3):
    torch.manual_seed(seed)
    for p in module.parameters():
        p.grad = None
    loss = module(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.parameters()], torch.rand(4)


def assert_same(got, expected):
    assert torch.equal(got[0], expected[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert torch.equal(got[2], expected[2])


@pytest.mark.parametrize("budget", [None, 0.5])
def test_offload_forced_matched_ops_and_bitwise_grads(budget):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(64, 256)
    expected = step(copy.deepcopy(model), x)
    compiled = torch.compile(
        copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", "offload": True, "memory_budget": budget}
    )
    assert_same(step(compiled, x), expected)
    plan = remat.last_plan()
    fw, bw = remat.last_graphs()
    offloaded = plan.offloaded
    assert offloaded and all(d.kept == d.nbytes for d in plan.decisions if d.action is remat.Action.OFFLOAD)
    assert fw.code.count("torch.ops.remat.offload.default(") == len(offloaded)
    assert bw.code.count("torch.ops.remat.reload.default(") == len(offloaded)
    assert "offload" in plan.table()


def test_offload_by_policy_only_where_asked():
    torch.manual_seed(0)
    model, x = Net(dropout=0.0), torch.randn(64, 256)
    expected = step(copy.deepcopy(model), x)
    policy = lambda node: remat.Action.OFFLOAD if node.op == "aten.tanh.default" else None  # noqa: E731
    compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", "policy": policy})
    assert_same(step(compiled, x), expected)
    plan = remat.last_plan()
    assert [d.op for d in plan.decisions if d.action is remat.Action.OFFLOAD] == ["aten.tanh.default"]
    assert "policy: OFFLOAD" in next(d.reason for d in plan.decisions if d.action is remat.Action.OFFLOAD)


def test_offload_auto_keeps_everything_on_cpu():
    # On CPU the host is the device: offloading frees nothing, so "auto" never chooses it.
    plan = remat.explain(Net(), torch.randn(64, 256), offload="auto", memory_budget=0.5)
    assert not plan.offloaded


@pytest.mark.inductor
def test_offload_compiles_with_inductor():
    torch.manual_seed(0)
    model, x = Net(dropout=0.0), torch.randn(64, 256)
    expected = step(copy.deepcopy(model), x)
    compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"offload": True, "contiguous": True})
    got = step(compiled, x)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(got[1], expected[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    fw, bw = remat.last_graphs()
    assert fw.code.count("remat.offload") == bw.code.count("remat.reload") > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(48.0).view(6, 8)[2:],  # storage offset
        lambda: torch.arange(48.0).view(6, 8).t(),  # transposed (dense, non-contiguous)
        lambda: torch.arange(48.0).view(6, 8)[:, ::2],  # strided
        lambda: torch.arange(8.0).view(1, 8).expand(6, 8),  # expanded (overlapping)
        lambda: torch.arange(48).view(6, 8) % 3 == 0,  # bool
        lambda: torch.zeros(0, 4),  # empty
    ],
    ids=["offset", "transposed", "strided", "expanded", "bool", "empty"],
)
def test_offload_round_trip_views(make):
    x = make()
    host = torch.ops.remat.offload.default(x)
    back = torch.ops.remat.reload(host, DEVICE)
    assert host.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() or x.numel() == 0
    assert back.dtype == x.dtype and back.shape == x.shape and torch.equal(back, x)
    if x.is_contiguous() or x.t().is_contiguous():
        assert back.stride() == x.stride()  # dense layouts keep their strides


def test_no_offload_work_under_no_grad():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(64, 256)
    compiled = torch.compile(
        copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", "offload": True, "profile": True}
    )
    step(compiled, x)
    profile = remat.last_plan().profile
    assert profile.totals().calls["offload"] > 0
    before = profile.totals()
    with torch.no_grad():
        out = compiled(x)
        compiled(x)
    assert not out.requires_grad
    assert profile.totals() == before  # no offload, no reload, no step recorded
    assert not streams_pending()


def streams_pending():
    from remat.runtime import streams

    return len(streams._copy_done)


def test_contiguous_one_arena_per_shape_set_reused_and_replanned():
    buffers.POOL.clear()
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(64, 256)
    expected = step(copy.deepcopy(model), x)
    compiled = torch.compile(
        copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", "contiguous": True, "memory_budget": 0.5}
    )
    for _ in range(4):
        got = step(compiled, x)
    assert_same(got, expected)
    # the first step learns the arena size; the second allocates it; later steps reuse it
    assert (buffers.POOL.stats.allocations, buffers.POOL.stats.reuses) == (1, 2)
    fw, _ = remat.last_graphs()
    stores = fw.graph.find_nodes(op="call_function", target=torch.ops.remat.arena_store.default)
    assert len(stores) == sum(
        1 for d in remat.last_plan().decisions if d.action is remat.Action.SAVE and d.op != "rng state" and d.nbytes
    )
    for store in stores:  # right after its value, which nothing but the store reads
        value = store.args[0]
        assert value.next is store and list(value.users) == [store]
        assert store.args[2] == len(stores)
    bigger = torch.randn(96, 256)
    expected = step(copy.deepcopy(model), bigger)
    for _ in range(3):
        got = step(compiled, bigger)  # a new shape: re-planned (a new graph), its own arena
    assert_same(got, expected)
    assert buffers.POOL.stats.allocations == 2
    buffers.POOL.clear()


def test_profile_records_each_step():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(64, 256)
    compiled = torch.compile(
        copy.deepcopy(model),
        backend="remat",
        options={"inner": "aot_eager", "profile": True, "offload": True, "memory_budget": 0.0},
    )
    for _ in range(3):
        step(compiled, x)
    plan = remat.last_plan()
    steps = plan.profile.steps
    assert len(steps) == 3
    offloaded = sum(d.nbytes for d in plan.decisions if d.action is remat.Action.OFFLOAD)
    for record in steps:
        assert record.bytes["offload"] == record.bytes["reload"] == offloaded
        assert record.calls["recompute"] > 0 and record.seconds["recompute"] > 0
    assert plan.profile.totals().bytes["offload"] == 3 * offloaded
    lines = repr(plan.profile).splitlines()
    assert lines[:2] == ["Profile: totals over 3 steps", lines[1]] and lines[1].split() == [
        "kind",
        "calls",
        "seconds",
        "bytes",
    ]
    offload_row = next(line.split(maxsplit=3) for line in lines if line.startswith("offload"))
    total = plan.profile.totals()
    assert offload_row == [
        "offload",
        str(total.calls["offload"]),
        f"{total.seconds['offload']:.6f}",
        fmt_bytes(3 * offloaded),
    ]


def test_profile_repr_is_the_totals_table():
    from remat.runtime.profile import Profile

    profile = Profile()
    assert repr(profile) == "Profile: no step recorded yet"
    profile.add("recompute", 0.5, 3 * 2**20)
    profile.add("offload", 0.25, 1024)
    profile.new_step()
    profile.add("recompute", 0.5, 2**20)
    assert (
        repr(profile)
        == str(profile)
        == profile.table()
        == "\n".join(
            [
                "Profile: totals over 2 steps",
                "kind       calls   seconds    bytes",
                "recompute      2  1.000000  4.0 MiB",
                "offload        1  0.250000  1.0 KiB",
                "reload         0  0.000000      0 B",
                "shard          0  0.000000      0 B",
                "gather         0  0.000000      0 B",
                "pack           0  0.000000      0 B",
            ]
        )
    )


def test_synchronize_reaches_the_ops():
    compiled = torch.compile(
        Net(), backend="remat", options={"inner": "aot_eager", "offload": True, "synchronize": True}
    )
    step(compiled, torch.randn(8, 256))
    fw, bw = remat.last_graphs()
    assert "remat.offload.default(" in fw.code and ", -1, True)" in fw.code


def test_shard_records_its_work_and_synchronizes(monkeypatch):
    """remat::shard takes profile_id and sync as offload does: its calls and this rank's bytes go to the profile,
    and with sync it waits for the device before and after."""
    from remat.runtime import ops, profile as profiles
    from remat.runtime.profile import Profile

    waited = []
    monkeypatch.setattr(profiles, "synchronize", lambda device: waited.append(device.type))
    record = Profile()
    x = torch.arange(15.0).view(3, 5)
    first = torch.ops.remat.shard(x, 0, 2, record.id, True)
    second = torch.ops.remat.shard(x, 1, 2, record.id, False)
    assert torch.equal(first, torch.arange(8.0)) and torch.equal(second, torch.tensor([8.0, 9, 10, 11, 12, 13, 14, 0]))
    step = record.steps[-1]
    assert step.calls["shard"] == 2 and step.bytes["shard"] == 2 * 8 * 4
    assert waited == ["cpu", "cpu"]
    assert ops.shard_numel(15, 2) == 8 and ops.shard_numel(16, 2) == 8 and ops.shard_numel(1, 4) == 1
    torch.ops.remat.shard(x, 0, 2)
    assert record.steps[-1].calls["shard"] == 2, "profile_id -1 records nothing"


def cuda_chain(layers=6, mib=1, flops=10**12):
    """A synthetic joint graph on "cuda": a forward chain whose values backward reads, 1 MiB each."""
    from remat.annotate import Constraints
    from remat.capture import Graph, Role, Value

    specs = [("x", Role.PRIMAL, ()), ("tangent", Role.TANGENT, ())]
    specs += [(f"f{i}", Role.FORWARD, ("x",) if i == 1 else (f"f{i - 1}",)) for i in range(1, layers + 1)]
    specs += [
        (f"b{i}", Role.BACKWARD, ("tangent" if i == layers else f"b{i + 1}", f"f{i}")) for i in range(layers, 0, -1)
    ]
    specs.append(("output", Role.OUTPUT, (f"f{layers}", "b1")))
    users = {name: [u for u, _, reads in specs if name in reads] for name, _, _ in specs}
    values = tuple(
        Value(
            name,
            i,
            role,
            "synthetic",
            reads,
            tuple(users[name]),
            mib * 2**20 if role is not Role.OUTPUT else 0,
            sympy.Integer(mib * 2**20),
            name,
            role is not Role.OUTPUT,
            False,
            False,
            (),
            "float32",
            "",
            frozenset(),
            device="cuda",
        )
        for i, (name, role, reads) in enumerate(specs)
    )
    graph = Graph(values, 1, (f"f{layers}",), ("b1",), ())
    costs = {v.name: flops for v in values}
    return graph, costs, Constraints({}, {}, {})


def test_offload_auto_on_cuda_leaves_the_device_peak():
    from remat.plan.evaluate import Evaluator
    from remat.plan.problem import build_problem
    from remat.plan.transfer import Transfer

    graph, costs, constraints = cuda_chain()
    keep = Evaluator(build_problem(graph, costs, constraints)).score(())
    # 2 MiB round trip at 12 GB/s ≈ 0.17 ms; a teraflop of forward compute after a value hides it (20 ms at 50 TF/s)
    auto = build_problem(graph, costs, constraints, Transfer(offload="auto", host_bandwidth=12 * 10**9))
    scored = Evaluator(auto).score(())
    # f5 is last read by f6 and f6 by nothing: no forward compute follows them to hide a copy
    assert scored.resolved.offloaded == frozenset(f"f{i}" for i in range(1, 5))
    assert scored.saved == keep.saved - 4 * 2**20 and scored.peak < keep.peak
    slow = build_problem(graph, costs, constraints, Transfer(offload="auto", host_bandwidth=1))
    assert not Evaluator(slow).score(()).resolved.offloaded  # 1 byte/s hides behind nothing


@pytest.mark.parametrize(
    "module,name,call",
    [
        ("torch._prims.rng_prims", "run_and_save_rng_state", lambda: remat._torch.rng_replay_ops()),
        ("torch._subclasses.fake_tensor", "unset_fake_temporarily", lambda: remat._torch.eager_dispatch().__enter__()),
        ("torch._C", "_DisablePythonDispatcher", lambda: remat._torch.eager_dispatch().__enter__()),
        ("torch._C", "_storage_Use_Count", lambda: remat._torch.storage_use_count(torch.empty(1))),
        ("torch._inductor.config", "_pre_fusion_custom_pass", lambda: remat._torch.inputs_never_reused([])),
        ("torch.cuda.memory", "_record_memory_history", lambda: remat._torch.cuda_allocator_trace("cuda").__enter__()),
    ],
)
def test_private_runtime_apis_are_guarded(monkeypatch, module, name, call):
    import importlib

    monkeypatch.delattr(importlib.import_module(module), name)
    with pytest.raises(remat._torch.TorchAPIError, match=f"{name}.*torch 2.11 to 2.14"):
        call()


def test_cuda_history_switch_is_guarded(monkeypatch):
    # a CPU build of torch has no CUDA allocator history at all; peak_memory asks only when it measures CUDA
    monkeypatch.delattr(torch._C, "_cuda_isHistoryEnabled", raising=False)
    with pytest.raises(remat._torch.TorchAPIError, match="_cuda_isHistoryEnabled.*torch 2.11 to 2.14"):
        remat._torch.cuda_history_recording()


def test_gathers_keep_their_tensors_until_the_next_one(tmp_path):
    """A gloo group releases a gather's work on its own thread while holding the lock the next gather takes; the
    gather's tensors stay referenced from Python until then, so that release never waits for the interpreter lock."""
    import torch.distributed as dist

    from remat.runtime import collective

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1, timeout=TIMEOUT)
    try:
        x = torch.arange(6.0).view(2, 3)
        first = collective.all_gather(x, 1)
        assert first.shape == (1, 2, 3) and torch.equal(first[0], x)
        held = collective._held.last
        assert held[1].data_ptr() == first.data_ptr()  # the output, referenced until the next gather
        second = collective.all_gather(x + 1, 1)
        assert collective._held.last is not held and torch.equal(second[0], x + 1)
    finally:
        dist.destroy_process_group()


def _mm_then_offload(a, b):
    x = torch.mm(a, b)
    host = torch.ops.remat.offload.default(x)
    return host, torch.mm(host, a)  # a buffer of x's size, computed after the offload (x is dead by then)


@pytest.mark.inductor
def test_inductor_never_reuses_memory_an_offload_reads():
    """On CUDA offload's copy to the host still reads its input after the op returned (side stream); inductor, left
    alone, writes the next matmul into that very buffer. Under inputs_never_reused it allocates a fresh one."""
    from torch._inductor.utils import run_and_get_code

    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def generated(context):
        torch._dynamo.reset()
        with context:
            (host, _), code = run_and_get_code(torch.compile(_mm_then_offload, backend="inductor"), a, b)
        torch._dynamo.reset()
        assert torch.equal(host, a @ b)
        return code[0]

    offload = torch.ops.remat.offload.default
    # the hazard: torch 2.13 writes the second matmul into x's buffer (2.11 happens to allocate a fresh one here)
    assert "# reuse" in generated(contextlib.nullcontext()) or torch.__version__ < "2.12"
    before = torch._inductor.config._pre_fusion_custom_pass
    code = generated(remat._torch.inputs_never_reused([offload]))
    assert "# reuse" not in code and code.count("empty_strided_cpu((64, 64)") == 2
    assert torch._inductor.config._pre_fusion_custom_pass is before


@pytest.mark.inductor
def test_inputs_never_reused_keeps_inductors_graph_cache():
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    counters.clear()
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True):
        for _ in range(2):
            torch._dynamo.reset()
            with remat._torch.inputs_never_reused([torch.ops.remat.offload.default]):
                torch.compile(_mm_then_offload, backend="inductor")(a, b)
    torch._dynamo.reset()
    assert counters["inductor"]["fxgraph_cache_miss"] == 1 and counters["inductor"]["fxgraph_cache_hit"] == 1


@pytest.mark.inductor
def test_inputs_never_reused_after_a_users_pass_without_uuid_runs_it_and_bypasses_the_cache():
    """A pre-fusion pass of the user's that inductor cannot key: it still runs, and inductor caches nothing (a cache
    hit would skip it), on every torch (2.11 keys CustomGraphPass, later ones CustomSchedulerPass)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    calls = []

    def users_pass(nodes):
        calls.append(len(nodes))
        return nodes

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    counters.clear()
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True, _pre_fusion_custom_pass=users_pass):
        for _ in range(2):
            torch._dynamo.reset()
            with remat._torch.inputs_never_reused([torch.ops.remat.offload.default]):
                torch.compile(_mm_then_offload, backend="inductor")(a, b)
    torch._dynamo.reset()
    assert len(calls) == 2
    assert counters["inductor"]["fxgraph_cache_hit"] == 0 and counters["inductor"]["fxgraph_cache_bypass"] == 2


def test_offload_of_a_cuda_value_compiles_under_inputs_never_reused():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from remat.backend import _async_reads

    gm = torch.fx.symbolic_trace(_mm_then_offload)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mm = next(n for n in gm.graph.nodes if n.target is torch.mm)
    for device, hooked in (("cpu", False), ("cuda", True)):
        with FakeTensorMode():
            for node in (*placeholders, mm):
                node.meta["val"] = torch.empty(64, 64, device=device)
        with _async_reads(gm):
            assert (torch._inductor.config._pre_fusion_custom_pass is not None) is hooked, device
        assert torch._inductor.config._pre_fusion_custom_pass is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.inductor
def test_offload_under_inductor_on_cuda_keeps_gradients():
    from remat import zoo

    config = zoo.GPTConfig(n_layer=2)
    model = zoo.GPT(config, seed=0).cuda()
    idx, targets = (t.cuda() for t in zoo.make_gpt_batch(config, 4, seed=0))
    eager = copy.deepcopy(model)
    torch.manual_seed(0)
    zoo.gpt_loss(eager, idx, targets).backward()
    compiled = torch.compile(
        lambda i, t: zoo.gpt_loss(model, i, t), backend="remat", options={"offload": True, "inner": "inductor"}
    )
    with torch._inductor.config.patch(fallback_random=True):
        for _ in range(3):  # the copies of one step race the kernels of the next ones too
            for p in model.parameters():
                p.grad = None
            torch.manual_seed(0)
            compiled(idx, targets).backward()
    assert remat.recent_plans()[-1].offloaded
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.inductor
def test_contiguous_compiles_with_inductor():
    """inductor keeps each arena slot as the forward's output (its stride order is the graph's), so it never reuses a
    slot's memory for a buffer of its own, which a later store would then read from the arena."""
    from remat import zoo

    buffers.POOL.clear()
    config = zoo.GPTConfig(n_layer=2, d_model=128, seq_len=128, dropout=0.0)
    model = zoo.GPT(config)
    idx, targets = zoo.make_gpt_batch(config, 4)
    reference = copy.deepcopy(model)
    zoo.gpt_loss(reference, idx, targets).backward()
    compiled = torch.compile(
        lambda i, t: zoo.gpt_loss(model, i, t), backend="remat", options={"memory_budget": 0.5, "contiguous": True}
    )
    for _ in range(3):  # the first step learns the arena, the second allocates it, the third reuses it
        for p in model.parameters():
            p.grad = None
        compiled(idx, targets).backward()
    assert (buffers.POOL.stats.allocations, buffers.POOL.stats.reuses) == (1, 1)
    for got, expected in zip(model.parameters(), reference.parameters()):
        assert (got.grad - expected.grad).abs().max() <= 1e-5 * expected.grad.abs().max()
    buffers.POOL.clear()
