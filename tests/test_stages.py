"""capture, cost and annotate on small graphs with exact answers."""

import pytest
import torch

import remat
from remat.annotate import annotate
from remat.capture import Role, capture
from remat.cost import FLOPS_PER_BYTE, costs
from remat.explain import capture_joints

from graphs import MIB, CosMM, cosmm_input


def facts(fn, *inputs, dynamic=None):
    (c,) = capture_joints(fn, *inputs, dynamic=dynamic)
    graph = capture(c.joint, c.num_fwd_outputs)
    return c.joint, graph


def test_roles_bytes_and_costs_are_exact():
    joint, graph = facts(CosMM(depth=2), cosmm_input())
    table = costs(joint, graph)
    mms = [v for v in graph.values if v.op == "aten.mm.default" and v.role is Role.FORWARD]
    coses = [v for v in graph.values if v.op == "aten.cos.default" and v.role is Role.FORWARD]
    assert len(mms) == 2 and len(coses) == 3
    assert all(v.nbytes == MIB and v.shape == (512, 512) and v.dtype == "float32" for v in mms + coses)
    assert all(table[v.name] == 2 * 512**3 for v in mms)
    assert all(table[v.name] == 2 * MIB * FLOPS_PER_BYTE for v in coses)
    sins = [v for v in graph.values if v.op == "aten.sin.default"]
    assert sins and all(v.role is Role.BACKWARD for v in sins)  # traced in backward, run in backward
    views = [v for v in graph.values if v.is_view]
    assert views and all(v.nbytes == 0 and table[v.name] == 0 for v in views)


def test_views_share_their_base_storage():
    def f(x):
        y = torch.cos(x)
        a, b = y.split(256, dim=0)
        return (a.t().sin() + b.t().sin()).sum()

    _, graph = facts(f, torch.randn(512, 512, requires_grad=True))
    cos = next(v for v in graph.values if v.op == "aten.cos.default")
    split_outputs = [v for v in graph.values if v.op == "getitem" and v.inputs[0].startswith("split")]
    assert len(split_outputs) == 2 and all(v.is_view and v.storage == cos.name for v in split_outputs)
    transposes = [v for v in graph.values if v.op == "aten.t.default" and v.role is Role.FORWARD]
    assert transposes and all(v.storage == cos.name for v in transposes)


def test_dynamic_shapes_keep_symbolic_bytes():
    def f(x, w):
        return torch.cos(x @ w).sum()

    x, w = torch.randn(8, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)  # the batch dimension
    _, graph = facts(f, x, w)
    mm = next(v for v in graph.values if v.op == "aten.mm.default" and v.role is Role.FORWARD)
    (batch,) = mm.nbytes_expr.free_symbols
    assert graph.symbols == (str(batch),)
    assert mm.nbytes == 8 * 64 * 4 == int(mm.nbytes_expr.subs(batch, 8))  # evaluated at the hint
    assert int(mm.nbytes_expr.subs(batch, 16)) == 16 * 64 * 4


def test_must_save_rules():
    bn = torch.nn.BatchNorm1d(64)

    def f(x):
        y = torch.nn.functional.dropout(torch.cos(x), 0.5, training=True)
        return torch.sin(bn(y)).view(-1).cos().sum()

    joint, graph = facts(f, torch.randn(16, 64, requires_grad=True))
    c = annotate(joint, graph, costs(joint, graph), rng="save")
    reasons = " | ".join(c.must_save.values())
    assert "random op" in reasons
    assert any(graph[n].op == "getitem" for n in c.must_save)  # the dropout mask and output, through getitems
    assert not c.replay
    replayed = annotate(joint, graph, costs(joint, graph))  # rng="replay": recomputable from a saved RNG state
    assert "random op" not in " | ".join(replayed.must_save.values())
    assert set(replayed.replay.values()) == {torch.get_rng_state().numel()}
    assert all("nondeterministic_seeded" in graph[n].tags for n in replayed.replay)
    views = [v.name for v in graph.values if v.is_view and v.role is Role.FORWARD]
    assert views and all("view of" in c.must_recompute[n] for n in views)


def test_policy_answers_are_checked_and_applied():
    model, x = CosMM(depth=2), cosmm_input()
    with pytest.raises(TypeError, match="policy returned 'save' for node .* must return remat.Action"):
        remat.explain(model, x, memory_budget=0.0, policy=lambda info: "save")

    save_cos = lambda info: remat.Action.SAVE if info.op == "aten.cos.default" else None  # noqa: E731
    plan = remat.explain(model, x, memory_budget=0.0, policy=save_cos)
    cos = [d for d in plan.decisions if d.op == "aten.cos.default"]
    assert cos and all(d.action is remat.Action.SAVE and d.reason == "policy: SAVE" for d in cos)

    recompute_mm = lambda info: remat.Action.RECOMPUTE if info.op == "aten.mm.default" else None  # noqa: E731
    plan = remat.explain(model, x, memory_budget=None, policy=recompute_mm)
    mm = [d for d in plan.decisions if d.op == "aten.mm.default"]
    assert mm and all(d.action is remat.Action.RECOMPUTE and d.reason == "policy: RECOMPUTE" for d in mm)


def test_prefer_recompute_steers_the_solver():
    model, x = CosMM(depth=3), cosmm_input()
    budget = remat.explain(model, x, memory_budget=None).peak_bytes - MIB
    plain = remat.explain(model, x, memory_budget=budget)
    prefer = lambda info: remat.Action.PREFER_RECOMPUTE if info.op == "aten.mm.default" else None  # noqa: E731
    steered = remat.explain(model, x, memory_budget=budget, policy=prefer)
    assert {d.op for d in plain.decisions if d.action is remat.Action.RECOMPUTE and d.cost} == {"aten.cos.default"}
    assert "aten.mm.default" in {d.op for d in steered.decisions if d.action is remat.Action.RECOMPUTE}


def test_planning_runs_on_its_own_thread_and_passes_back_results_and_errors():
    import threading

    from remat.pipeline import on_own_thread

    caller = threading.get_ident()
    assert on_own_thread(lambda a, b: (a + b, threading.get_ident()), 2, 3)[0] == 5
    assert on_own_thread(threading.get_ident) != caller

    def fails(budget):
        raise ValueError(f"memory_budget={budget!r}: no")

    with pytest.raises(ValueError, match="memory_budget=7: no"):
        on_own_thread(fails, 7)


def test_the_opaque_check_is_asked_under_the_name_this_torch_gives_it(monkeypatch):
    """capture asks torch's registry of opaque types whether a non-tensor value is one (_torch.is_opaque) under the
    name this torch gives the check: is_custom_class_obj from 2.14, is_opaque_value before (on 2.14 the old name
    logs a deprecation warning on every call); on a torch with neither, nothing is opaque but a script object."""
    from torch._library import opaque_object

    from remat import _torch

    names = ("is_custom_class_obj", "is_opaque_value")
    current = next((n for n in names if hasattr(opaque_object, n)), None)
    asked: list[str] = []
    for name in names:
        if hasattr(opaque_object, name):
            original = getattr(opaque_object, name)
            monkeypatch.setattr(opaque_object, name, lambda v, n=name, f=original: asked.append(n) or f(v))
    facts(CosMM(depth=1), cosmm_input())  # the output node's value is no tensor
    assert set(asked) == {current} if current else not asked

    for present in (names, names[1:], ()):
        for name in names:
            if name in present:
                monkeypatch.setattr(opaque_object, name, lambda v, n=name: asked.append(n) or True, raising=False)
            else:
                monkeypatch.delattr(opaque_object, name, raising=False)
        asked.clear()
        assert _torch.is_opaque(object()) is bool(present)
        assert asked == list(present[:1])


def test_the_partitioner_cse_is_keyed_as_this_torch_keys_it(monkeypatch):
    """_torch.min_cut_cse merges repeated computations as this torch's min-cut partitioner does: where torch's
    fx_graph_cse takes a key per node (2.14), the key says whether the gradients are computed from the node, so a
    value they need is not merged with an equal one only the forward outputs need; where it takes none, the graph
    alone."""
    from torch._functorch import compile_utils

    from remat import _torch

    calls = []

    def keyed(fx_g, extra_node_key=None):
        calls.append({n.name: extra_node_key(n) for n in fx_g.nodes})
        return fx_g

    def plain(fx_g):
        calls.append(None)
        return fx_g

    (c,) = capture_joints(CosMM(depth=2), cosmm_input())
    monkeypatch.setattr(compile_utils, "fx_graph_cse", keyed)
    _torch.min_cut_cse(c.joint, c.num_fwd_outputs)
    (keys,) = calls
    nodes = {n.name: n for n in c.joint.graph.nodes}
    output = nodes.pop("output")
    forward_outputs = [a.name for a in output.args[0][: c.num_fwd_outputs]]
    gradients = [a.name for a in output.args[0][c.num_fwd_outputs :] if a is not None]
    tangents = [name for name in nodes if name.startswith("tangents")]
    assert gradients and tangents and all(keys[n] for n in gradients + tangents)
    assert all(keys[u.name] for t in tangents for u in nodes[t].users)  # computed from a tangent, so gradients
    assert not any(keys[n] for n in forward_outputs)  # the loss: no gradient reads it
    monkeypatch.setattr(compile_utils, "fx_graph_cse", plain)
    _torch.min_cut_cse(c.joint, c.num_fwd_outputs)
    assert calls[1:] == [None]
