"""A pick simulates only the candidates its answer may depend on (evaluate.pick, Scored.floor, Scored.exceeds): on
seeded random graphs, under the fusing (inductor) and eager inner models, with transfers and with the contiguous
arena, the floors (bounds.floor, bounds.backward_floor) never exceed a simulated peak, and the lazy pick returns the
member that simulating every candidate returns, at every budget, with fewer simulations."""

import functools
import warnings
from unittest import mock

import pytest

from random_graphs import random_model
from remat import zoo
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan.evaluate import Evaluator, least_peak, pick
from remat.plan.family import heuristic_family
from remat.plan import bounds
from remat.plan.bounds import backward_floor, floor, saved_floor
from remat.plan.simulate import simulate

SEEDS = [pytest.param(seed, marks=pytest.mark.slow) if seed >= 2 else seed for seed in range(12)]


@functools.lru_cache(maxsize=None)
def problem(seed: int, inner: str, **options):
    model, inputs = random_model(seed, size=10 + seed % 7)
    (captured,) = capture_joints(model, *inputs)
    config = RematConfig(memory_budget=None, inner=inner, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_joint(captured.joint, captured.num_fwd_outputs, config).problem


def reference(family, budget: int) -> int:
    """The member `pick` returns, found by simulating every member."""
    peaks = [m.peak for m in family]
    feasible = [i for i in range(len(family)) if peaks[i] <= budget]
    if feasible:
        return min(feasible, key=lambda i: (family[i].cost, peaks[i], i))
    return min(range(len(family)), key=lambda i: (peaks[i], family[i].cost, i))


@pytest.mark.parametrize("inner", ["inductor", "aot_eager"])
@pytest.mark.parametrize("seed", SEEDS)
def test_lazy_pick_returns_what_simulating_every_member_returns(seed, inner):
    check_lazy_pick(problem(seed, inner))


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_lazy_pick_with_the_arena_returns_what_simulating_every_member_returns(seed):
    check_lazy_pick(problem(seed, "inductor", contiguous=True))


def check_lazy_pick(p) -> None:
    full = heuristic_family(Evaluator(p))
    for member in full:
        assert floor(p, member.resolved) <= member.peak
        assert backward_floor(p, member.resolved) <= member.peak
    least, base = min(m.peak for m in full), max(m.peak for m in full)
    budgets = [0, least - 1, least, *(least + k * (base - least) // 7 for k in range(1, 8)), base + 1]
    simulated, distinct = [], len({m.resolved for m in full})
    for budget in budgets:
        evaluator = Evaluator(p)  # a fresh one per budget, as each compile has
        family = heuristic_family(evaluator)
        chosen = pick(family, budget)
        assert chosen is family[reference(full, budget)], budget
        simulated.append(len(evaluator._memo))
    assert all(n <= distinct for n in simulated)
    assert sum(simulated) < len(budgets) * distinct, "the floor spared no simulation on this graph"


@pytest.mark.parametrize("options", [{"offload": True}, {"contiguous": True}], ids=["offload", "contiguous"])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_floor_bounds_the_peak_with_transfers(seed, options):
    p = problem(seed, "inductor", **options)
    raised = 0
    for member in heuristic_family(Evaluator(p)):
        saved, bound = saved_floor(p, member.resolved), floor(p, member.resolved)
        assert saved <= bound <= member.peak
        raised += bound > saved
    if options.get("contiguous"):  # the arena and a backward library call's needs: above the saved bytes
        assert p.library_calls and raised, "the arena floor never rose above the saved bytes"


@pytest.mark.parametrize("inner", ["inductor", "aot_eager"])
@pytest.mark.parametrize("seed", [0, 1, pytest.param(5, marks=pytest.mark.slow)])
def test_variants_share_resolved_plans_that_their_own_problem_resolves_alike(seed, inner):
    """A family's variants (a kind of op kept saved, random ops kept saved) resolve a plan through the evaluator's
    shared table of plans by the positions they recompute: each member's plan is the one its own problem resolves,
    and some variant plan is taken from the table rather than walked again."""
    p = problem(seed, inner, rng="replay")
    evaluator = Evaluator(p)
    family = heuristic_family(evaluator)
    variants = list(evaluator._variants.values())
    assert variants, "the graph has no op kind or random op a variant keeps saved"
    assert all(v._walks is evaluator._walks for v in variants)
    for owner in (evaluator, *variants):
        for chosen, resolved in owner._resolved.items():
            assert resolved == owner.problem.resolve(chosen)
    walked = len(evaluator._walks)
    asked = sum(len(owner._resolved) for owner in (evaluator, *variants))
    assert walked < asked, f"{asked} resolutions walked {walked} plans: none was shared"
    assert len(family) >= asked


@pytest.mark.parametrize("options", [{"inner": "inductor"}, {"inner": "aot_eager"}, {"contiguous": True}])
def test_variants_share_the_facts_of_the_graph_that_their_own_problem_derives_alike(options):
    """A family's variants share the problem's facts of the graph (Problem.constrained, GRAPH_FACTS): each is the
    one the variant derives on its own, and derived once for them all."""
    import dataclasses

    import numpy as np

    from remat.plan.problem import GRAPH_FACTS

    p = problem(0, options.get("inner", "inductor"), rng="replay", contiguous=options.get("contiguous", False))
    evaluator = Evaluator(p)
    heuristic_family(evaluator)
    variants = [v.problem for v in evaluator._variants.values()]
    assert variants and len(GRAPH_FACTS) >= 9
    for variant in variants:
        assert variant.graph_memo is p.graph_memo
        alone = dataclasses.replace(variant)  # the same fields, no facts derived yet
        assert alone.graph_memo is not p.graph_memo
        for name in GRAPH_FACTS:
            shared, own = getattr(variant, name), getattr(alone, name)
            assert shared is p.graph_memo[name]
            if name == "sole_readers":
                continue  # a memo the simulations fill: checked below, by simulating with it and without
            if isinstance(own, np.ndarray):
                assert np.array_equal(shared, own), name
            else:
                assert shared == own, name
        for member in heuristic_family(evaluator)[:8]:
            assert simulate(variant, member.resolved) == simulate(dataclasses.replace(variant), member.resolved)


def test_an_evaluator_of_a_problem_resolving_otherwise_keeps_its_own_table():
    """A problem whose plans resolve differently for the same positions (here: a saved value it must offload) gets
    a table of its own from `restricted`."""
    import dataclasses
    import types

    p = problem(0, "aot_eager")
    evaluator = Evaluator(p)
    name = next(n for n in p.needed if n in p.choosable)  # saved when nothing is recomputed
    offloading = dataclasses.replace(
        p,
        constraints=dataclasses.replace(p.constraints, must_offload=types.MappingProxyType({name: "test"})),
    )
    other = evaluator.restricted(offloading)
    assert other._walks is not evaluator._walks
    assert other.score(()).resolved.offloaded == {name}
    assert evaluator.score(()).resolved.offloaded == frozenset()


@functools.lru_cache(maxsize=None)
def llama_problem(inner: str, **options):
    """A 2-layer Llama-style decoder's joint graph, planned without a budget."""
    config = zoo.GPTConfig(vocab=64, n_layer=2, d_model=64, n_head=2, seq_len=32, dropout=0.0)
    idx, targets = zoo.make_gpt_batch(config, batch=2)
    loss = functools.partial(zoo.gpt_loss, zoo.Llama(config, seed=0))
    (captured,) = capture_joints(loss, idx, targets, inner="inductor")
    config = RematConfig(memory_budget=None, inner=inner, **options)
    return plan_joint(captured.joint, captured.num_fwd_outputs, config).problem


@pytest.mark.parametrize(
    ("inner", "options"),
    [("inductor", {}), ("aot_eager", {}), ("inductor", {"contiguous": True})],
    ids=["inductor", "aot_eager", "contiguous"],
)
def test_backward_floor_sees_recomputation_and_spares_simulations(inner, options):
    """The plan recomputing everything it may recomputes the forward ahead of the first backward matmul, and much of
    it waits for later backward matmuls: the backward floor (what is live at a backward library call in every
    order) is above its saved bytes, and no higher than its simulated peak. Asked only where the first floor does not
    settle a pick, it spares simulations of a Llama-style decoder's family and changes no answer: the least peak and
    each budget's pick are those made without it."""
    p = llama_problem(inner, **options)
    everything = Evaluator(p).score(p.choosable)
    assert floor(p, everything.resolved) < backward_floor(p, everything.resolved) <= everything.peak
    without = Evaluator(p)
    with mock.patch.object(bounds, "backward_floor", lambda *args: 0):
        family = heuristic_family(without)
        full = [m.peak for m in family]
        least = least_peak(family)
        budgets = [least.peak, (least.peak + everything.peak) // 2, max(full)]
        expected = [least, *(pick(family, b) for b in budgets)]
    evaluator = Evaluator(p)
    family = heuristic_family(evaluator)
    found = [least_peak(family), *(pick(family, b) for b in budgets)]
    assert [(m.chosen, m.peak, m.cost) for m in found] == [(m.chosen, m.peak, m.cost) for m in expected]
    assert len(evaluator._memo) < len(without._memo), "the backward floor spared no simulation"
    for member in family:
        assert backward_floor(p, member.resolved) <= member.peak


def test_backward_floor_above_a_low_limit_is_what_every_plan_needs():
    """Asked whether a plan exceeds a limit below what some backward library call needs in every plan (the
    least-peak search asks for 0 bytes), backward_floor answers with that need, a bound no higher than the plan's
    whole one, without walking the plan's sets; from it up, it walks them as before."""
    p = llama_problem("inductor")
    everything = Evaluator(p).score(p.choosable).resolved
    need = max(call.live for call in p.later_calls)
    whole = backward_floor(p, everything)
    assert 0 < need < whole
    assert backward_floor(p, everything, 0) == backward_floor(p, everything, need - 1) == need
    assert need < backward_floor(p, everything, need) <= whole


def test_bytes_of_a_bitset_are_the_sum_of_its_storages():
    """bounds._bytes adds the sizes of the set bits one by one for a few, under a mask for many: the same integers."""
    import random

    import numpy as np

    rng = random.Random(0)
    for n in (5, 40, 700, 10_017):
        sizes = np.array([rng.randint(0, 2**24) for _ in range(n)], dtype=np.int64)
        for _ in range(50):
            bits = rng.getrandbits(n) & rng.getrandbits(n) & rng.getrandbits(n)
            assert bounds._bytes(bits, sizes) == sum(int(sizes[i]) for i in range(n) if bits >> i & 1)
    assert bounds._bytes(0, np.zeros(3, dtype=np.int64)) == 0
