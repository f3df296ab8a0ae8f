"""The baseline is the inner compiler's own partition: under inductor and aot_eager, exactly what torch's min-cut
partitioner saves (as plain `torch.compile` with that backend runs it), and remat without a budget runs that
partition."""

import copy
import re

import pytest
import torch

import remat
from remat import _torch
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

CONFIG = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.1)


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=32,
        vocab_size=128,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    idx, tgt = make_gpt_batch(CONFIG, batch=2)
    return lambda i, t: torch.nn.functional.cross_entropy(model(input_ids=i).logits.reshape(-1, 128), t.reshape(-1)), (
        idx,
        tgt,
    )


def _gpt():
    model = GPT(CONFIG)
    return (lambda i, t: gpt_loss(model, i, t)), make_gpt_batch(CONFIG, batch=2)


INNERS = [pytest.param("inductor", marks=pytest.mark.inductor), "aot_eager"]


@pytest.mark.parametrize("inner", INNERS)
@pytest.mark.parametrize("build", [_gpt, _gpt2], ids=["gpt", "hf-gpt2"])
def test_none_saves_exactly_what_min_cut_saves(build, inner):
    fn, inputs = build()
    (captured,) = capture_joints(fn, *inputs, inner=inner)
    joint = copy.deepcopy(captured.joint.graph)
    planned = plan_joint(
        captured.joint,
        captured.num_fwd_outputs,
        RematConfig(inner=inner),
        captured.hooked,
        captured.static_lifetime_input_indices,
    )
    # torch's partitioner on its own copy of the same joint graph, as plain torch.compile runs it
    reference = torch.fx.GraphModule(captured.joint, joint)
    _, _, saved = _torch.min_cut_partition(reference, captured.num_fwd_outputs, captured.static_lifetime_input_indices)
    assert planned.plan.baseline.kind == f"{inner} min-cut partition"
    assert planned.resolved.saved | planned.resolved.inputs == set(saved)
    assert planned.is_baseline and planned.inner_modules is not None
    # fraction 1.0 resolves to that partition's simulated peak
    one = plan_joint(
        captured.joint,
        captured.num_fwd_outputs,
        RematConfig(inner=inner, memory_budget=1.0),
        captured.hooked,
        captured.static_lifetime_input_indices,
    )
    assert one.plan.budget_bytes == planned.plan.baseline.peak_bytes == planned.plan.peak_bytes


@pytest.mark.parametrize("inner", INNERS)
def test_none_costs_what_plain_torch_compile_costs(inner):
    """remat without a budget against plain torch.compile with the same backend: the same measured peak and the
    same gradients (bitwise under aot_eager); under inductor the very code plain torch.compile generates, forward
    and backward, so the step costs the same time too."""
    from torch._inductor.utils import run_and_get_code

    model = GPT(CONFIG)
    idx, tgt = make_gpt_batch(CONFIG, batch=2)
    results, code = {}, {}
    for backend, options in ((inner, None), ("remat", {"memory_budget": None, "inner": inner})):
        m = copy.deepcopy(model)
        step = torch.compile(lambda i, t: gpt_loss(m, i, t), backend=backend, options=options)
        with torch._inductor.config.patch(fallback_random=True):
            torch.manual_seed(0)
            _, code[backend] = run_and_get_code(lambda: step(idx, tgt).backward())
            for p in m.parameters():
                p.grad = None
            torch.manual_seed(0)
            peak = remat.peak_memory(
                lambda: step(idx, tgt).backward(), exclude=lambda: [p.grad for p in m.parameters()]
            )
        results[backend] = (peak, [p.grad.clone() for p in m.parameters()])
        torch._dynamo.reset()
    assert results["remat"][0] == results[inner][0]
    if inner == "inductor":
        # the forward's and the backward's, but for the id inductor numbers its compiles with
        ours, plain = ([re.sub(r"AOT ID: \['\d+_", "AOT ID: ['", c) for c in code[b]] for b in ("remat", inner))
        assert len(ours) == 2 and ours == plain
    for a, b in zip(results["remat"][1], results[inner][1]):
        if inner == "aot_eager":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_policies_keep_the_default_partition_as_baseline():
    fn, inputs = _gpt()
    (captured,) = capture_joints(fn, *inputs)
    planned = plan_joint(
        captured.joint, captured.num_fwd_outputs, RematConfig(inner="inductor", save_ops=["aten.addmm"])
    )
    assert planned.plan.baseline.kind == "default partition" and planned.inner_modules is None


def test_min_cut_partition_builds_modules_whose_code_is_generated_when_first_read():
    """torch's partitioner runs in lazy-module mode, as inside torch.compile: the modules it builds generate their
    Python code only when run or read, and their saved set and results are those of eagerly built modules."""
    fn, inputs = _gpt()
    (captured,) = capture_joints(fn, *inputs, inner="inductor")
    copies = [torch.fx.GraphModule(captured.joint, copy.deepcopy(captured.joint.graph)) for _ in range(2)]
    fw, _, saved = _torch.min_cut_partition(copies[0], captured.num_fwd_outputs)
    import torch.fx._lazy_graph_module as lazy

    assert isinstance(fw, lazy._LazyGraphModule) and fw._needs_recompile()
    assert "def forward" in fw.code and not fw._needs_recompile()  # generated on first read
    with lazy._force_skip_lazy_graph_module():
        eager_fw, _, eager_saved = _torch.min_cut_partition(copies[1], captured.num_fwd_outputs)
    assert not isinstance(eager_fw, lazy._LazyGraphModule) and eager_saved == saved
    assert fw.code == eager_fw.code


def test_without_lazy_modules_the_partition_builds_plain_modules(monkeypatch):
    import torch.fx._lazy_graph_module as lazy

    graph = torch.fx.symbolic_trace(lambda a: a + 1).graph
    with _torch.lazy_graph_modules() as make_module:
        assert isinstance(make_module(torch.nn.Module(), graph), lazy._LazyGraphModule)
    monkeypatch.delattr(lazy, "_use_lazy_graph_module")
    with _torch.lazy_graph_modules() as make_module:
        gm = make_module(torch.nn.Module(), graph)
    assert not isinstance(gm, lazy._LazyGraphModule) and "def forward" in gm.code


@pytest.mark.parametrize("inner", INNERS)
@pytest.mark.parametrize("build", [_gpt, _gpt2], ids=["gpt", "hf-gpt2"])
def test_min_cut_saved_is_the_partitions_saved_set(build, inner):
    """The saved set read off torch's partitioner before it builds modules is the one its modules save; the
    builder it stopped is torch's own again afterwards."""
    from torch._functorch import partitioners

    fn, inputs = build()
    (captured,) = capture_joints(fn, *inputs, inner=inner)
    builder = partitioners._extract_fwd_bwd_modules
    chosen = _torch.min_cut_saved(captured.joint, captured.num_fwd_outputs, captured.static_lifetime_input_indices)
    assert partitioners._extract_fwd_bwd_modules is builder
    _, _, saved = _torch.min_cut_partition(
        captured.joint, captured.num_fwd_outputs, captured.static_lifetime_input_indices
    )
    assert len(saved) > 10 and set(chosen) == set(saved)


def test_min_cut_saved_under_dynamic_shapes_is_the_whole_partitions():
    """With symbolic sizes the module builder adds their bindings to the saved set, so the whole partition runs."""
    fn, inputs = _gpt()
    (captured,) = capture_joints(fn, *inputs, dynamic=True)
    assert any(isinstance(n.meta.get("val"), torch.SymInt) for n in captured.joint.graph.find_nodes(op="placeholder"))
    chosen = _torch.min_cut_saved(captured.joint, captured.num_fwd_outputs, captured.static_lifetime_input_indices)
    _, _, saved = _torch.min_cut_partition(
        captured.joint, captured.num_fwd_outputs, captured.static_lifetime_input_indices
    )
    symbolic = {n.name for n in captured.joint.graph.nodes if isinstance(n.meta.get("val"), torch.SymInt)}
    assert chosen == saved and symbolic & set(saved)


def test_a_budget_plans_without_building_the_partitions_modules(monkeypatch):
    """Under a budget torch's partitioner is stopped once it has chosen (min_cut_saved); its modules are built only
    when asked for, and a budget whose plan is that partition runs the very modules `None` runs."""
    from remat import pipeline

    fn, inputs = _gpt()
    (captured,) = capture_joints(fn, *inputs)
    args = captured.joint, captured.num_fwd_outputs
    static = captured.hooked, captured.static_lifetime_input_indices
    built = []
    whole = _torch.min_cut_partition
    monkeypatch.setattr(pipeline._torch, "min_cut_partition", lambda *a, **k: built.append(1) or whole(*a, **k))
    half = plan_joint(*args, RematConfig(inner="aot_eager", memory_budget=0.5), *static)
    one = plan_joint(*args, RematConfig(inner="aot_eager", memory_budget=1.0), *static)
    assert not built and not half.is_baseline and one.is_baseline
    none = plan_joint(*args, RematConfig(inner="aot_eager"), *static)
    assert built == [1] and one.inner_modules is not None and built == [1, 1]
    for ours, plain in zip(one.inner_modules, none.inner_modules):
        assert ours.code == plain.code


def test_min_cut_saved_where_the_partitioner_builds_no_modules_through_the_builder(monkeypatch):
    """A torch whose partitioner never hands its choice to `_extract_fwd_bwd_modules`: the whole partition runs and
    its modules' saved set is returned."""
    from torch._functorch import partitioners

    fn, inputs = _gpt()
    (captured,) = capture_joints(fn, *inputs)
    fw, bw, saved = _torch.min_cut_partition(captured.joint, captured.num_fwd_outputs)
    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", lambda *a, **k: (fw, bw))
    assert _torch.min_cut_saved(captured.joint, captured.num_fwd_outputs) == saved


def test_min_cut_saved_stops_only_its_own_threads_partition(monkeypatch):
    """While min_cut_saved waits for its partitioner's choice, a partition on another thread (a plain torch.compile
    elsewhere in the process) reaches torch's own module builder; afterwards torch's partitioner calls the builder it
    called before."""
    import threading

    from torch._functorch import partitioners

    from remat._torch import split

    builder = lambda *args, **kwargs: "built"  # noqa: E731 - torch's builder, as far as this test goes
    monkeypatch.setattr(partitioners, "_extract_fwd_bwd_modules", builder)
    # the builder remat's own split uses may be another (tests stand in an older torch's there)
    monkeypatch.setattr(split, "extract_fwd_bwd_modules", lambda: lambda *args, **kwargs: "split's")
    node = torch.fx.Graph().placeholder("saved")
    seen = {}

    def partition(joint, *args, **kwargs):
        other = threading.Thread(target=lambda: seen.update(other=partitioners._extract_fwd_bwd_modules(joint, [], [])))
        other.start()
        other.join()
        return partitioners._extract_fwd_bwd_modules(joint, [node], [])

    monkeypatch.setattr(split, "_min_cut", partition)
    joint = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    assert split.min_cut_saved(joint, 1) == ("saved",)
    assert seen == {"other": "built"} and partitioners._extract_fwd_bwd_modules is builder
