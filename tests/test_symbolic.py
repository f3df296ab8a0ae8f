"""Symbolic memory under dynamic shapes, and max_batch found from it (aot_eager only)."""

import time
import warnings

import pytest
import sympy
import torch

import remat
from remat import zoo
from remat.annotate import Constraints
from remat.capture import Graph, Role, Value
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan.problem import build_problem
from remat.plan.simulate import lifetimes, simulate
from remat.plan.symbolic import _Terms, symbolic_memory
from remat.sizing import max_batch

from graphs import MIB, CosMM, cosmm_input

GPT = zoo.GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.1)
HINT, SEQ = 4, 16  # the traced batch and sequence length (below seq_len, so dynamo does not specialize it)


def gpt_tokens(batch, seq=SEQ):
    return zoo.make_gpt_batch(GPT, batch)[0][:, :seq].contiguous()


def planned(captured, budget):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # infeasible budgets: the least-peak plan, as intended here
        config = RematConfig(memory_budget=budget, inner="aot_eager")
        return plan_joint(captured.joint, captured.num_fwd_outputs, config)


def decisions(plan):
    # node names differ between a dynamic and a static trace; ops, modules and actions do not
    return [(d.op, d.module_path, d.action) for d in plan.decisions]


@pytest.fixture(scope="module")
def gpt_joints():
    """The GPT step traced once with dynamic batch and sequence (at HINT × SEQ), and statically at batch 2, 4, 8."""
    model = zoo.GPT(GPT)
    x = gpt_tokens(HINT)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(x, 1)
    (dynamic,) = capture_joints(model, x)
    static = {b: capture_joints(model, gpt_tokens(b))[0] for b in (2, 4, 8)}
    return dynamic, static


def batch_and_seq(graph):
    """The (batch, sequence) symbols: the sequence one sizes the position ids, arange(T)."""
    (seq,) = next(v for v in graph.values if v.op.startswith("aten.arange")).nbytes_expr.free_symbols
    (batch,) = {sympy.Symbol(s, integer=True, positive=True) for s in graph.symbols} - {seq}
    return batch, seq


def test_without_symbols_the_figures_are_the_simulated_integers():
    (c,) = capture_joints(CosMM(), cosmm_input())
    for budget in (None, 8 * MIB + 16, 0.0):
        p = planned(c, budget)
        peak, saved = symbolic_memory(p.problem, p.resolved)
        timeline = simulate(p.problem, p.resolved)
        assert isinstance(peak, sympy.Integer) and isinstance(saved, sympy.Integer)
        assert (int(peak), int(saved)) == (timeline.peak_bytes, timeline.saved_bytes)
        assert (int(peak), int(saved)) == (p.plan.peak_bytes, p.plan.saved_bytes)


@pytest.mark.parametrize("budget", [None, 600_000])
def test_peak_expr_is_the_static_plans_peak_at_each_batch(gpt_joints, budget):
    """The dynamic plan's expressions at batch 2, 4, 8 equal the figures of the plans of static traces at those
    batches. With a byte budget (between the least and the baseline peak at HINT, so some values are recomputed),
    the static plan at batch b gets it scaled by b / HINT: the sizes scale with the batch, and the planner reaches
    the same decisions — checked before the figures are compared."""
    dynamic, static = gpt_joints
    p = planned(dynamic, budget)
    if budget is not None:
        assert p.plan.recompute_flops > 0 and p.plan.least_peak_bytes < p.plan.peak_bytes <= budget
        assert budget < p.plan.baseline.peak_bytes
    peak, saved = symbolic_memory(p.problem, p.resolved)
    batch, seq = batch_and_seq(p.problem.graph)
    assert peak.free_symbols == saved.free_symbols == {batch, seq}
    assert all(s.is_integer and s.is_positive for s in peak.free_symbols)
    assert int(peak.subs({batch: HINT, seq: SEQ})) == p.plan.peak_bytes
    for b, captured in static.items():
        s = planned(captured, None if budget is None else budget * b // HINT)
        assert decisions(s.plan) == decisions(p.plan)
        assert int(peak.subs({batch: b, seq: SEQ})) == s.plan.peak_bytes
        assert int(saved.subs({batch: b, seq: SEQ})) == s.plan.saved_bytes


def brute_force(problem, resolved, at):
    """Max over every step of the live bytes, and the saved bytes, at sizes `at`: no pruning."""
    graph, life = problem.graph, lifetimes(problem, resolved)
    nbytes = {o: int(graph.values[o].nbytes_expr.xreplace(at)) for o, _, _ in life.spans}
    live = [0] * (len(life.fw) + len(life.bw))
    for owner, first, final in life.spans:
        for step in range(first, final + 1):
            live[step] += nbytes[owner]
    for size, first, final in life.extra_spans:  # generator states of replayed random ops: fixed sizes
        for step in range(first, final + 1):
            live[step] += size
    saved = sum(int(graph[n].nbytes_expr.xreplace(at)) for n in life.saved_spans)
    return max(live), saved + sum(size for size, _, _ in life.extra_spans)


SIZES = [(1, 1), (2, 3), (3, 32), (8, 2), (5, 17), (64, 1), (1, 4096)]


def test_reduced_max_equals_the_max_over_every_step(gpt_joints):
    """Terms in B, B·T, B·T²: the pruned Max equals the maximum of every step's live bytes, on both sides of the
    hint, for plans that recompute nothing, some values and as much as they can."""
    dynamic, _ = gpt_joints
    for budget in (None, 0.5, 0.0):
        p = planned(dynamic, budget)
        peak, saved = symbolic_memory(p.problem, p.resolved)
        assert isinstance(peak, sympy.Max) and len(peak.args) <= 12
        batch, seq = batch_and_seq(p.problem.graph)
        for sizes in SIZES:
            at = {batch: sympy.Integer(sizes[0]), seq: sympy.Integer(sizes[1])}
            assert (int(peak.xreplace(at)), int(saved.xreplace(at))) == brute_force(p.problem, p.resolved, at)


def chain_problem(layers):
    """A synthetic joint graph of 2·layers + 3 nodes: a forward chain with skip connections and a backward chain
    reading it, whose byte sizes mix the monomials 1, B, T, B·T, B·T², B²."""
    B, T = sympy.symbols("B T", integer=True, positive=True)
    monomials = (1, B, T, B * T, B * T**2, B**2)
    hint = {B: 4, T: 16}
    specs = [("x", Role.PRIMAL, (), 4 * B * T), ("tangent", Role.TANGENT, (), 4 * B * T)]
    for i in range(1, layers + 1):
        reads = ("x",) if i == 1 else (f"f{i - 1}",) + ((f"f{i - 3}",) if i > 3 else ())
        specs.append((f"f{i}", Role.FORWARD, reads, 4 * (1 + i % 5) * monomials[i % len(monomials)]))
    for i in range(layers, 0, -1):
        reads = ("tangent" if i == layers else f"b{i + 1}", f"f{i}") + ((f"f{i - 1}",) if i > 1 else ())
        specs.append((f"b{i}", Role.BACKWARD, reads, 4 * (1 + i % 3) * monomials[(i + 2) % len(monomials)]))
    specs.append(("output", Role.OUTPUT, (f"f{layers}", "b1"), sympy.Integer(0)))
    users = {name: [] for name, *_ in specs}
    for name, _, reads, _ in specs:
        for r in reads:
            users[r].append(name)
    values = tuple(
        Value(
            name,
            i,
            role,
            "synthetic",
            reads,
            tuple(users[name]),
            int(sympy.sympify(expr).xreplace(hint)),
            sympy.sympify(expr),
            name,
            role is not Role.OUTPUT,
            False,
            False,
            (),
            "float32",
            "",
            frozenset(),
        )
        for i, (name, role, reads, expr) in enumerate(specs)
    )
    graph = Graph(values, 1, (f"f{layers}",), ("b1",), ("B", "T"))
    problem = build_problem(graph, {v.name: 1 for v in values}, Constraints({}, {}, {}))
    return problem, (B, T)


def test_a_thousand_step_graph_is_reduced_fast_and_exactly():
    problem, (B, T) = chain_problem(600)
    every_third = problem.choosable[::3]
    for chosen in ((), every_third, problem.choosable):
        resolved = problem.resolve(chosen)
        began = time.perf_counter()
        peak, saved = symbolic_memory(problem, resolved)
        assert time.perf_counter() - began < 1.0
        assert len(peak.args) < 50
        for sizes in SIZES:
            at = {B: sympy.Integer(sizes[0]), T: sympy.Integer(sizes[1])}
            assert (int(peak.xreplace(at)), int(saved.xreplace(at))) == brute_force(problem, resolved, at)


def test_dominance_is_proved_through_monomial_divisibility():
    s, t = sympy.symbols("s t", integer=True, positive=True)
    terms = _Terms()

    def vec(expr):
        return tuple(sorted(terms.decompose(expr).items()))

    assert terms.dominated(vec(2 * s + 1), vec(3 * s))  # 1 <= s
    assert not terms.dominated(vec(2 * s + 3), vec(3 * s + 1))  # false at s = 1
    assert terms.dominated(vec(5 * s * t + 4 * s), vec(9 * s * t**2))  # s <= s*t <= s*t**2
    assert not terms.dominated(vec(s * t), vec(s**2))  # not comparable
    assert not terms.dominated(vec(sympy.floor(s / 3) + s), vec(2 * s))  # floor(s/3) is no monomial
    assert terms.dominated(vec(s), vec(sympy.floor(s / 3) + s))  # a nonnegative surplus


@pytest.fixture(scope="module")
def mlp():
    return zoo.MLP(width=256, depth=4)


def mlp_inputs(batch):
    return zoo.make_mlp_batch(256, batch)


def test_max_batch_agrees_with_a_measured_search(mlp):
    budget = MIB
    fit = max_batch(mlp, mlp_inputs, budget, hint=HINT)
    assert fit.predicted_peak <= budget < fit.predicted_next
    assert fit.measured_peak <= budget < fit.measured_next
    # what the simulation leaves out: the one-element tangent and a few bytes of bookkeeping
    assert fit.predicted_peak <= fit.measured_peak <= fit.predicted_peak + 64
    assert fit.predicted_next <= fit.measured_next <= fit.predicted_next + 64
    assert fit.expr.free_symbols == {fit.symbol}
    assert int(fit.expr.subs(fit.symbol, HINT)) == fit.plan.peak_bytes

    # The same plan measured: remat compiled at HINT with a dynamic batch, then run at growing batches.
    torch._dynamo.reset()
    compiled = remat.compile(mlp, memory_budget=budget, inner="aot_eager")
    params = list(mlp.parameters())

    def step(x):
        for p in params:
            p.grad = None
        compiled(x).sum().backward()

    x = mlp_inputs(HINT)
    torch._dynamo.mark_dynamic(x, 0)
    step(x)
    granularity, fits = 16, None
    for b in range(granularity, 1 << 12, granularity):
        x = mlp_inputs(b)
        step(x)
        if remat.peak_memory(step, x, exclude=lambda: [p.grad for p in params]) > budget:
            break
        fits = b
    for p in params:
        p.grad = None
    assert fits is not None and fits <= fit.batch < fits + granularity


def test_max_batch_refuses_fractions_and_budgets_nothing_fits(mlp):
    with pytest.raises(ValueError, match=r"memory_budget=0\.5: max_batch needs a budget in bytes"):
        max_batch(mlp, mlp_inputs, 0.5)
    with pytest.raises(ValueError, match=r"memory_budget=None"):
        max_batch(mlp, mlp_inputs, None)
    with pytest.raises(ValueError, match=r"no input of make_inputs\(4\) has dimension 1 equal to the batch size"):
        max_batch(mlp, mlp_inputs, "1MiB", batch_dim=1)
    with pytest.warns(UserWarning, match="cannot be met"):  # the planner's, at the hint
        with pytest.raises(ValueError, match=r"memory_budget=1000: even batch 1 does not fit"):
            max_batch(mlp, mlp_inputs, 1000, measure=False)
    fit = max_batch(mlp, mlp_inputs, "1GiB", limit=300, measure=False)
    assert fit.batch == 300 and fit.measured_peak is None


def test_plan_carries_the_expressions():
    plan = remat.explain(CosMM(), cosmm_input(), memory_budget=0.5)
    assert plan.peak_bytes_expr == plan.peak_bytes and plan.saved_bytes_expr == plan.saved_bytes
