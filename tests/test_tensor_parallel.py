"""Tensor parallelism, FSDP2 and DDP with four buckets on two gloo ranks: backend="remat" gives the loss and every
gradient of the same model compiled with the plain backend, bitwise under aot_eager, at every kind of budget;
partition= over the tensor-parallel group shards only the activations every rank holds alike.

All scenarios, the inductor one included, run in one spawn of two processes (a module fixture), each reporting its own
result or error, so the whole file stays within a few tens of seconds on two cores."""

import json
import inspect
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import sympy
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat import _torch
from remat.capture import Graph, Role, Value
from remat.plan.replication import rank_local
from ranks import TIMEOUT
from ranks import spawn as spawn_ranks

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

D, HEADS, SEQ, BATCH = 64, 4, 16, 4
BUDGETS = (None, 0.5, 0.0, 60_000)  # a byte budget between the least reachable peak and the baseline's


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / world of them
        q, k, v = (proj(x).view(b, s, -1, D // HEADS).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.drop = nn.Linear(D, 4 * D), nn.Linear(4 * D, D), nn.Dropout(0.1)

    def forward(self, x):
        return self.down(self.drop(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(D), Attention(), nn.LayerNorm(D), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def tensor_parallel(model, mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.out": RowwiseParallel(),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(),
    }
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    return model


def sequence_parallel(model, mesh):
    """Megatron's sequence parallelism: the residual stream and the layer norms hold this rank's part of the
    sequence; each block gathers it before attention and the MLP and reduce-scatters their outputs back."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {
        "ln1": SequenceParallel(),
        "ln2": SequenceParallel(),
        "attn": gather,
        "mlp": gather,
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.out": RowwiseParallel(output_layouts=Shard(1)),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    return model


def fsdp(model, mesh=None):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def local(t):
    """A gradient as this rank holds it: a DTensor's local tensor, a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def step(model, x, seed=3):
    torch.manual_seed(seed)  # the dropout masks: the same draws for both backends
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach(), [local(p.grad).clone() for p in model.parameters()]


def same(a, b, rtol=None):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    pairs = [(loss_a, loss_b), *zip(grads_a, grads_b)]
    if rtol is None:
        return len(grads_a) == len(grads_b) and all(torch.equal(x, y) for x, y in pairs)
    return all(torch.allclose(x, y, rtol=rtol, atol=1e-7) for x, y in pairs)


def data(rank, per_rank):
    torch.manual_seed(100 + (rank if per_rank else 0))
    return torch.randn(BATCH, SEQ, D)


def run_compiled(build, x, backend, options=None):
    torch.manual_seed(0)
    result = step(torch.compile(build(), backend=backend, options=options), x)
    torch._dynamo.reset()
    return result


def compare(build, x, budgets, rtol=None, inner="aot_eager", **options):
    """For each budget: whether `build()` compiled with remat at it (and `options`) gives the loss and gradients of
    `build()` compiled with the plain backend `inner`, and its number of gradients."""
    reference = run_compiled(build, x, inner)
    found = {}
    for budget in budgets:
        before = {id(plan) for plan in remat.recent_plans()}
        result = run_compiled(build, x, "remat", {"inner": inner, "memory_budget": budget, **options})
        plans = [plan for plan in remat.recent_plans() if id(plan) not in before]
        found[str(budget)] = {
            "equal": same(reference, result, rtol),
            "grads": len(result[1]),
            "graphs": len(plans),
            "recomputed": sum(len(plan.recomputed) for plan in plans),
        }
    return found


def scenario_tp(mesh, rank):
    x = data(rank, per_rank=False)  # tensor parallelism: every rank of the group sees the same batch
    return compare(lambda: tensor_parallel(Model(blocks=1), mesh), x, BUDGETS)


def scenario_fsdp(mesh, rank):
    x = data(rank, per_rank=True)  # data parallelism: each rank its own batch
    return compare(lambda: fsdp(Model()), x, BUDGETS)


class Wide(nn.Module):
    """Four 1 MiB weights: with 1 MiB buckets DDP's optimizer makes one graph per layer."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512, bias=False) for _ in range(4))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        for layer in self.layers:
            x = self.drop(F.gelu(layer(x)))
        return x


def scenario_ddp(mesh, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(100 + rank)
    x = torch.randn(BATCH * SEQ, 512)  # each rank its own batch

    def build():
        torch.manual_seed(1)
        return DDP(Wide(), bucket_cap_mb=1)

    return compare(build, x, (None, 0.5, 0.0, 2 * 2**20))


def scenario_fsdp_tp(mesh, rank):
    from torch.distributed.device_mesh import init_device_mesh

    mesh2 = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    x = data(rank, per_rank=False)
    return compare(lambda: fsdp(tensor_parallel(Model(blocks=1), mesh2["tp"]), mesh2["dp"]), x, BUDGETS)


def scenario_partition(mesh, rank):
    """partition= over the tensor-parallel group, every rank fed the same batch: the plan partitions only the
    replicated activations (layer-norm outputs, residual sums), keeps the rank-local ones whole."""
    x = data(rank, per_rank=False)
    # debug=True: the plan's invariant checks run, and the ranks compare the partitioned values on every call
    result = compare(
        lambda: tensor_parallel(Model(), mesh), x, [None], partition=mesh.get_group(), profile=True, debug=True
    )["None"]
    plan = remat.last_plan()
    result["partitioned"] = [(d.name, d.nbytes, d.kept) for d in plan.decisions if d.action is remat.Action.PARTITION]
    result["kept_whole"] = [d.reason for d in plan.decisions if "not partitioned" in d.reason]
    shard = plan.profile.steps[-1]
    result["shard"] = [shard.calls["shard"], shard.bytes["shard"]]
    return result


def scenario_sequence_parallel(mesh, rank):
    """Sequence parallelism, with partition= over the group: bitwise at no budget and at 0.0; only the gathered
    (replicated) activations are partitioned, never the sequence shards."""
    x = data(rank, per_rank=False).chunk(2, dim=1)[rank].contiguous()  # this rank's half of the sequence
    result = compare(lambda: sequence_parallel(Model(blocks=1), mesh), x, [None, 0.0], partition=mesh.get_group())
    plan = remat.last_plan()
    result["partitioned"] = sorted(plan.partitioned)
    result["kept_whole"] = [d.reason for d in plan.decisions if "not partitioned" in d.reason]
    return result


def scenario_peak(mesh, rank):
    """peak_memory leaves out DTensor gradients: each stands for its local tensor, whose allocation is the one left
    out (checked on the recorded events, exactly), and the measured step peak drops by most of their bytes (the
    profiler's figures vary by a few KiB between runs, so the least of three is compared)."""
    from remat import measure

    torch.manual_seed(0)
    model = tensor_parallel(Model(), mesh)
    compiled = torch.compile(model, backend="remat", options={"inner": "aot_eager", "memory_budget": 0.0})
    x = data(rank, per_rank=False)
    step(compiled, x)  # compile outside the measurement
    params = list(model.parameters())

    def measured(exclude):
        peaks = []
        for _ in range(3):
            for p in params:
                p.grad = None
            peaks.append(remat.peak_memory(lambda: step(compiled, x), exclude=exclude))
        return min(peaks)

    whole = measured(None)
    without = measured(lambda: [p.grad for p in params])
    grads = [p.grad for p in params if type(p.grad).__name__ == "DTensor"]
    events = [(i, local(g).data_ptr(), local(g).untyped_storage().nbytes()) for i, g in enumerate(grads)]
    torch._dynamo.reset()
    return {
        "whole": whole,
        "without": without,
        "dtensor_grads": len(grads),
        "grad_bytes": sum(local(g).untyped_storage().nbytes() for g in grads),
        "excluded": sorted(measure._excluded_allocations(events, grads)),
        "excluded_locals": sorted(measure._excluded_allocations(events, [local(g) for g in grads])),
    }


def scenario_old_torch(mesh, rank):
    """On a torch whose partitioner cannot hand opaque objects to backward, the compile fails with remat's message.
    First the same compile with the real partitioner, recording the opaque objects remat hands it: a torch that
    traces the mesh out of the graph (2.11) has none, and the compile then needs no such parameter."""
    real = _torch.extract_fwd_bwd_modules()
    handed: list = []

    def recording(joint, saved_values, saved_sym_nodes, *, num_fwd_outputs, saved_opaque_nodes=(), **kwargs):
        handed.extend(saved_opaque_nodes)
        if saved_opaque_nodes:
            kwargs["saved_opaque_nodes"] = saved_opaque_nodes
        return real(joint, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def without_opaque(joint, saved_values, saved_sym_nodes, *, num_fwd_outputs, static_lifetime_input_nodes=None):
        return real(
            joint,
            saved_values,
            saved_sym_nodes,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=static_lifetime_input_nodes,
        )

    def compile_and_step():
        options = {"inner": "aot_eager", "memory_budget": 0.0}
        step(torch.compile(tensor_parallel(Model(), mesh), backend="remat", options=options), data(rank, False))

    original = _torch.split.extract_fwd_bwd_modules
    try:
        _torch.split.extract_fwd_bwd_modules = lambda: recording
        compile_and_step()
        torch._dynamo.reset()
        _torch.split.extract_fwd_bwd_modules = lambda: without_opaque
        compile_and_step()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
        return {"error": f"{type(exc).__name__}: {exc}", "opaque": len(handed)}
    finally:
        _torch.split.extract_fwd_bwd_modules = original
        torch._dynamo.reset()
    return {"opaque": len(handed)}


def scenario_inductor(mesh, rank):
    x = data(rank, per_rank=False)
    build = lambda: tensor_parallel(Model(blocks=1), mesh)  # noqa: E731
    return compare(build, x, [0.0], rtol=1e-5, inner="inductor")["0.0"]


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def worker(rank, world, init, out, names):
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        mesh = init_device_mesh("cpu", (world,))
        results = {}
        for name in names:
            started = time.perf_counter()
            try:
                results[name] = SCENARIOS[name](mesh, rank)
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
                results[name] = {"failed": f"{type(exc).__name__}: {exc}"}
            results.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def spawn(out, names):
    return spawn_ranks(worker, out, names)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    found = spawn(tmp_path_factory.mktemp("tp"), list(SCENARIOS))
    print("seconds per scenario on rank 0:", found[0]["seconds"])  # shown with pytest -s
    return found


def results(ranks, name):
    found = [r[name] for r in ranks]
    for result in found:
        assert "failed" not in result, result.get("failed")
    return found


def assert_budgets_planned(result, graphs, budgets=BUDGETS):
    """Every budget compiled to `graphs` graphs, and budget 0.0 recomputes more than no budget (whose recomputed
    values are the views the default partition re-creates in backward)."""
    assert set(result) == {str(b) for b in budgets}
    assert all(outcome["graphs"] == graphs for outcome in result.values()), result
    assert result["None"]["recomputed"] < result["0.0"]["recomputed"], result


def test_tensor_parallel_matches_plain_backend_bitwise_at_every_budget(ranks):
    for result in results(ranks, "tp"):
        assert_budgets_planned(result, graphs=1)
        for budget, outcome in result.items():
            assert outcome["equal"] and outcome["grads"] == 16, budget  # the parameters of one block


def test_fsdp2_per_block_matches_plain_backend_bitwise(ranks):
    for result in results(ranks, "fsdp"):
        assert_budgets_planned(result, graphs=2)  # one per block: FSDP2's hooks run between them
        for budget, outcome in result.items():
            assert outcome["equal"] and outcome["grads"] == 32, budget


def test_fsdp2_with_tensor_parallel_on_a_1x2_mesh_matches_plain_backend_bitwise(ranks):
    for result in results(ranks, "fsdp_tp"):
        assert_budgets_planned(result, graphs=1)
        for budget, outcome in result.items():
            assert outcome["equal"] and outcome["grads"] == 16, budget


def test_ddp_with_four_buckets_matches_plain_backend_bitwise(ranks):
    for result in results(ranks, "ddp"):
        assert set(result) == {"None", "0.5", "0.0", str(2 * 2**20)}
        assert all(outcome["graphs"] == 4 for outcome in result.values()), result  # one graph per bucket
        assert result["None"]["recomputed"] < result["0.0"]["recomputed"], result
        for budget, outcome in result.items():
            assert outcome["equal"] and outcome["grads"] == 4, budget


def test_partition_over_tensor_parallel_group_keeps_half_of_replicated_activations(ranks):
    found = results(ranks, "partition")
    assert found[0]["partitioned"] == found[1]["partitioned"]
    for result in found:
        assert result["equal"]
        partitioned = result["partitioned"]
        # the replicated values aot_eager's min-cut partition (the baseline) saves: the residual sums at least
        assert len(partitioned) >= 3, partitioned
        assert all(2 * kept == nbytes for _, nbytes, kept in partitioned)
        # the runtime's shard ops keep exactly the planned halves
        assert result["shard"] == [len(partitioned), sum(kept for _, _, kept in partitioned)]
        # column-parallel outputs are this rank's shard: saved whole, with the reason
        assert result["kept_whole"] and all("DTensor input" in why for why in result["kept_whole"])


def test_sequence_parallel_with_partition_over_the_group_matches_plain_backend_bitwise(ranks):
    found = results(ranks, "sequence_parallel")
    assert found[0]["partitioned"] == found[1]["partitioned"]
    for result in found:
        assert result["None"]["equal"] and result["0.0"]["equal"]
        assert result["partitioned"], result  # the all-gathered block inputs
        assert any("reduce_scatter_tensor over the partition group" in why for why in result["kept_whole"])


def test_peak_memory_leaves_out_dtensor_gradients(ranks):
    for result in results(ranks, "peak"):
        assert result["dtensor_grads"] == 24  # the column- and row-parallel weights and biases of both blocks
        assert result["excluded"] == result["excluded_locals"] == list(range(24))
        assert result["whole"] - result["without"] >= result["grad_bytes"] // 2, result


def value(name, index, role, op="aten.mm.default", inputs=(), subclass_attr="", group=""):
    return Value(
        name=name,
        index=index,
        role=role,
        op=op,
        inputs=inputs,
        users=(),
        nbytes=4096,
        nbytes_expr=sympy.Integer(4096),
        storage=name,
        is_tensor=True,
        is_view=False,
        is_multi=False,
        shape=(32, 32),
        dtype="float32",
        module_path="",
        tags=frozenset(),
        device="cpu",
        subclass_attr=subclass_attr,
        group=group,
    )


def test_rank_local_values_follow_dtensor_shards_and_collectives_over_the_group():
    """A DTensor's local tensor and what is computed from it differ across the tensor-parallel group "tp"; an
    all_reduce over "tp" makes its result the same on every rank again, one over another group does not, and a
    reduce_scatter over "tp" hands each rank its own part."""
    P, F = Role.PRIMAL, Role.FORWARD
    values = [
        value("primals_1", 0, P, "placeholder"),  # the batch: a plain input
        value("primals_2", 1, P, "placeholder", subclass_attr="_local_tensor"),  # a column-parallel weight's shard
        value("primals_3", 2, P, "placeholder", subclass_attr="device_mesh"),
        value("mm", 3, F, inputs=("primals_1", "primals_2")),
        value("all_reduce", 4, F, "_c10d_functional.all_reduce.default", ("mm",), group="tp"),
        value("wait", 5, F, "_c10d_functional.wait_tensor.default", ("all_reduce",)),
        value("add", 6, F, "aten.add.Tensor", ("wait", "primals_1")),
        value("dp_reduce", 7, F, "_c10d_functional.all_reduce.default", ("mm",), group="dp"),
        value("scatter", 8, F, "_c10d_functional.reduce_scatter_tensor.default", ("add",), group="tp"),
        value("relu", 9, F, "aten.relu.default", ("scatter",)),
        value("x2", 10, F, "aten.mul.Tensor", ("primals_1",)),
    ]
    local = rank_local(Graph(tuple(values), 1, ("relu",), (), ()), "tp")
    assert sorted(local) == ["dp_reduce", "mm", "primals_2", "relu", "scatter"]
    assert (
        local["mm"]
        == local["dp_reduce"]
        == (
            "computed from primals_2, this rank's shard of a DTensor input (tensor parallelism), different on each rank"
        )
    )
    assert (
        local["relu"] == "computed from scatter, reduce_scatter_tensor over the partition group gives each rank "
        "its own part"
    )


def test_split_joint_names_the_torch_version_when_opaque_objects_cannot_be_handed_over(monkeypatch):
    def extract(joint, saved_values, saved_sym_nodes, *, num_fwd_outputs):
        raise AssertionError("not reached: the guard raises first")

    monkeypatch.setattr(_torch.split, "extract_fwd_bwd_modules", lambda: extract)
    mesh = torch.fx.Graph().placeholder("primals_2")
    with pytest.raises(
        _torch.TorchAPIError,
        match=rf"primals_2: .*torch {re.escape(torch.__version__)}'s .*"
        r"saved_opaque_nodes",
    ):
        _torch.split_joint(None, [], [], [mesh], num_fwd_outputs=1)


def test_a_forward_opaque_object_is_handed_to_backward_never_planned():
    """An op of the forward that returns an opaque object (a registered opaque type, as a process group is): no
    bytes, kept for backward as it is, never a solver's choice nor moved off the device."""
    opaque = pytest.importorskip("torch._opaque_base", reason="this torch has no registered opaque types")
    from torch._library.opaque_object import register_opaque_type

    from remat.annotate import annotate
    from remat.capture import capture
    from remat.plan.problem import build_problem
    from remat.plan.transfer import Transfer, eligible

    class Handle(opaque.OpaqueBase):
        pass

    register_opaque_type(Handle, typ="reference")

    def make_handle(x):
        return Handle()

    g = torch.fx.Graph()
    x, tangent = g.placeholder("primals_1"), g.placeholder("tangents_1")
    handle = g.call_function(make_handle, (x,))
    y = g.call_function(torch.ops.aten.sin.default, (x,))
    grad = g.call_function(torch.ops.aten.mul.Tensor, (tangent, y))
    for node in (x, tangent, y, grad):
        node.meta["val"] = torch.randn(256)
    handle.meta["val"] = Handle()
    g.output([y, grad, handle])
    joint = torch.fx.GraphModule(torch.nn.Module(), g)
    graph = capture(joint, 1)
    assert graph["make_handle"].is_opaque and graph["make_handle"].nbytes == 0
    costs = {v.name: 0 for v in graph.values}
    constraints = annotate(joint, graph, costs)
    assert constraints.must_save["make_handle"].startswith("opaque object")
    problem = build_problem(graph, costs, constraints, Transfer(offload=True, world=2))
    assert "make_handle" not in problem.choosable and not eligible(graph, "make_handle")


def test_torch_without_opaque_support_fails_with_a_clear_error(ranks):
    """Where the graph hands opaque objects to backward (the device mesh, on 2.13), a partitioner without
    saved_opaque_nodes fails with remat's message; where it hands none (2.11 traces the mesh out), it compiles."""
    extract = _torch.extract_fwd_bwd_modules()
    takes_opaque = "saved_opaque_nodes" in inspect.signature(extract).parameters
    for result in results(ranks, "old_torch"):
        error = result.get("error", "")
        if takes_opaque and torch.__version__ >= "2.13":
            assert result["opaque"] > 0, result  # this torch keeps the mesh in the graph
        if result["opaque"]:
            assert "saved_opaque_nodes" in error and f"torch {torch.__version__}" in error, error
            assert "device mesh" in error
        else:
            assert error == "", error


@pytest.mark.slow
@pytest.mark.inductor
def test_tensor_parallel_under_inductor_matches_plain_inductor(ranks):
    for result in results(ranks, "inductor"):
        assert result["equal"]


def test_torchrun_example_runs_on_two_cpu_ranks():
    """examples/tp_fsdp.py under torchrun (FSDP2 + tensor parallelism on a 1x2 mesh, gloo): both ranks report the
    same loss (they hold one batch), a plan per graph and a measured peak."""
    root = pathlib.Path(__file__).resolve().parent.parent
    # CPU ranks also on a machine with a GPU: the example takes nccl and one GPU per rank when it sees CUDA
    env = {**os.environ, "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "examples/tp_fsdp.py",
            "--small",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    heads = re.findall(
        r"^rank (\d) \(dp 0/1, tp (\d)/2\): loss ([\d.]+), memory_budget 1536KiB, (\d+) graph", run.stdout, re.M
    )
    assert [(rank, tp) for rank, tp, _, _ in heads] == [("0", "0"), ("1", "1")], run.stdout
    assert heads[0][2] == heads[1][2]  # the tensor-parallel ranks compute one loss
    graphs = int(heads[0][3])
    assert graphs >= 1 and run.stdout.count("  graph ") == 2 * graphs
    assert len(re.findall(r"measured peak of a step: [\d.]+ MiB", run.stdout)) == 2
