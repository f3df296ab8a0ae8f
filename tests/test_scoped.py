"""remat's own compiles (explain, pareto, max_batch) leave the user's compiled functions alone: no recompile, no
lost code, no entries added next to the user's, nothing kept alive (remat/scoped.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list, cached_backends
from torch._dynamo.utils import counters

import remat
from remat import scoped, zoo

W = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).requires_grad_()


def f(x):
    return torch.cos(torch.cos(x @ W) @ W).sum()


def g(x):
    return torch.sin(x @ W).sum()


def with_break(x):
    y = torch.cos(x @ W)
    torch._dynamo.graph_break()
    return torch.cos(y @ W).sum()


def x():
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(1))


class Counting:
    """The user's backend: counts its compiles and runs the graph as traced."""

    def __init__(self):
        self.compiles = 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        return gm.forward


def valid_entries(fn) -> list:
    code = fn.forward.__code__ if isinstance(fn, nn.Module) else fn.__code__
    return [e for e in _debug_get_cache_entry_list(code) if e.code is not None]


def compiled_by_user(fn):
    """`fn` compiled by the user and run once; returns (compiled, backend, the compiled code of its entries)."""
    backend = Counting()
    compiled = torch.compile(fn, backend=backend)
    compiled(x())
    assert backend.compiles == 1
    return compiled, backend, [e.code for e in valid_entries(fn)]


def assert_untouched(fn, compiled, backend, codes):
    graphs = counters["stats"]["unique_graphs"]
    compiled(x())
    assert backend.compiles == 1, "the user's function recompiled"
    assert counters["stats"]["unique_graphs"] == graphs
    assert [e.code for e in valid_entries(fn)] == codes, "the user's cache entries changed"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # the tests start from an empty cache; what remat does in between is under test
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("explained", [f, g, with_break], ids=["same function", "other function", "graph break"])
def test_explain_leaves_the_users_compiled_function_alone(explained):
    compiled, backend, codes = compiled_by_user(f)
    backends = set(cached_backends)
    plan = remat.explain(explained, x(), inner="aot_eager", memory_budget=0.5)
    assert plan.decisions
    assert_untouched(f, compiled, backend, codes)
    assert set(cached_backends) == backends, "explain's backends are not kept alive by dynamo's backend cache"
    if explained is with_break:
        # the graph break compiled with_break's own frame; that entry is forgotten, none is valid
        assert valid_entries(with_break) == []


def test_explain_a_module_the_user_compiled():
    torch.manual_seed(0)
    model = zoo.MLP(width=64, depth=2)
    compiled, backend, codes = compiled_by_user(model)
    remat.explain(model, x(), inner="aot_eager", memory_budget=0.0)
    assert_untouched(model, compiled, backend, codes)


def test_explain_repeated_past_the_recompile_limit():
    """More explains of one function than dynamo's recompile limit: each still captures (its own code object), and
    the user's compile of the same function keeps its single entry."""
    compiled, backend, codes = compiled_by_user(f)
    peaks = {
        remat.explain(f, x(), inner="aot_eager", memory_budget=0.0).peak_bytes
        for _ in range(torch._dynamo.config.recompile_limit + 1)
    }
    assert len(peaks) == 1
    assert_untouched(f, compiled, backend, codes)


def test_pareto_measured_leaves_the_users_compiled_function_alone():
    compiled, backend, codes = compiled_by_user(f)
    result = remat.pareto(f, x(), budgets=[1.0, 0.0], measure=True, repeat=1)
    assert [r.measured_peak_bytes is not None for r in result.rows] == [True, True]
    assert_untouched(f, compiled, backend, codes)


def test_max_batch_leaves_the_users_compiled_function_alone():
    torch.manual_seed(0)
    mlp = zoo.MLP(width=64, depth=2)
    compiled, backend, codes = compiled_by_user(f)
    fit = remat.max_batch(mlp, lambda b: zoo.make_mlp_batch(64, b), 256 * 1024, limit=64)
    assert fit.measured_peak is not None
    assert_untouched(f, compiled, backend, codes)


def test_own_code_is_a_new_code_object_each_time():
    first, second = scoped.own_code(f), scoped.own_code(f)
    assert first.__code__ is not second.__code__
    assert first(x()) == f(x())


def test_session_forgets_only_what_was_compiled_inside():
    compiled, backend, codes = compiled_by_user(f)
    inside = Counting()
    with scoped.session():
        torch.compile(f, backend=inside)(x())  # the same code object as the user's compile
        assert len(valid_entries(f)) == 2
    assert [e.code for e in valid_entries(f)] == codes
    assert_untouched(f, compiled, backend, codes)


def test_captures_of_other_shapes_are_traced_static_and_dynamos_shape_memory_is_left_as_it_was():
    """dynamo remembers per (file, line, name) which sizes changed between compiles (automatic dynamic shapes), and
    remat's own compiles share one such key (scoped.own_code): without putting that memory back, a second capture of
    another shape was traced with symbolic sizes."""
    import torch._dynamo.pgo as pgo

    from remat.explain import capture_joints

    compiled = torch.compile(lambda x: torch.cos(x).sum(), backend=Counting())
    for n in (8, 16):  # the user's own compiles: dynamo learns that this function's first size changes
        compiled(torch.randn(n, 4))
    state = {key: repr(value) for key, value in pgo.get_code_state().items()}
    assert state
    for n in (8, 16, 32):
        (captured,) = capture_joints(lambda x: torch.sin(x).sum(), torch.randn(n, 4, requires_grad=True))
        placeholders = [node.meta["val"] for node in captured.joint.graph.nodes if node.op == "placeholder"]
        assert all(isinstance(v, torch.Tensor) for v in placeholders), n
        assert placeholders[0].shape == (n, 4)
    assert {key: repr(value) for key, value in pgo.get_code_state().items()} == state


@pytest.mark.parametrize("enabled", [True, False])
def test_planning_leaves_the_garbage_collector_as_it_was(enabled, monkeypatch):
    """Planning pauses Python's collector (pipeline.gc_paused) and hands it back in the state it found it, also
    when planning raises; the youngest generation is collected once, after planning (what torch's own partition left
    behind), unless the caller had the collector off."""
    import gc

    from remat import pipeline
    from remat.pipeline import gc_paused

    during, events = [], []
    make_plan, baseline_of = pipeline.make_plan, pipeline.baseline_of

    def watched(*args):
        during.append(gc.isenabled())
        events.append("plan")
        return make_plan(*args)

    def partitioned(*args):
        events.append("partition")
        return baseline_of(*args)

    def collected(phase, info):
        if phase == "start" and events:
            events.append(f"collect {info['generation']}")

    monkeypatch.setattr(pipeline, "make_plan", watched)
    monkeypatch.setattr(pipeline, "baseline_of", partitioned)

    was = gc.isenabled()
    gc.callbacks.append(collected)
    try:
        gc.enable() if enabled else gc.disable()
        compiled = torch.compile(f, backend="remat", options={"memory_budget": 0.5, "inner": "aot_eager"})
        compiled(x().requires_grad_()).backward()
        assert during == [False]
        # what torch's partition left behind is collected once planning is done (not before: planning would fill
        # the holes it leaves), unless the caller turned the collector off
        planned = events.index("plan")
        assert events[: planned + 1] == ["partition", "plan"]
        assert (events[planned + 1 : planned + 2] == ["collect 0"]) is enabled
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError, match="inside"):
            with gc_paused():
                assert not gc.isenabled()
                raise RuntimeError("inside")
        assert gc.isenabled() is enabled
    finally:
        gc.callbacks.remove(collected)
        gc.enable() if was else gc.disable()


def test_planning_frees_what_it_simulated_without_the_collector(monkeypatch):
    """The evaluators a plan is made with (the problem's and its variants'), their families and every timeline
    they simulated are freed as planning ends by reference counting alone: a family's members refer back to their
    evaluator, and Evaluator.close breaks those cycles, which would otherwise hold them until Python's collector
    runs."""
    import gc
    import weakref

    from random_graphs import synthetic_chain

    from remat.config import RematConfig
    from remat.explain import capture_joints
    from remat.pipeline import plan_joint
    from remat.plan import evaluate

    made: list[weakref.ref] = []
    init = evaluate.Evaluator.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(evaluate.Evaluator, "__init__", recording)
    model, inputs = synthetic_chain(4)
    (captured,) = capture_joints(model, *inputs)
    was = gc.isenabled()
    gc.disable()
    try:
        planned = plan_joint(captured.joint, captured.num_fwd_outputs, RematConfig(memory_budget=0.5))
        assert planned.plan.timeline.peak_bytes <= planned.plan.budget_bytes
        assert len(made) >= 2  # the problem's evaluator and a variant's (each matmul kind saved)
        assert [ref() for ref in made] == [None] * len(made)
    finally:
        if was:
            gc.enable()
