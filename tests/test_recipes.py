"""Hand-written checkpointing recipes as candidate plans, and a larger search space never giving a worse plan."""

import copy
import random
import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import remat
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan.evaluate import Evaluator
from remat.plan.recipes import SAVED_OPS, block_outputs, blocks, recipes
from remat.plan import family, greedy
from remat.plan.family import HEAVY_OPS, recipe_family
from remat.plan.solve import _plan
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from random_graphs import FUZZ_KINDS, random_model
from test_fuzz import plan_of, trace_joint

CONFIG = GPTConfig(vocab=128, n_layer=4, d_model=64, n_head=4, seq_len=32, dropout=0.1)


@pytest.fixture(scope="module")
def gpt():
    model = GPT(CONFIG)
    idx, tgt = make_gpt_batch(CONFIG, batch=4)
    (captured,) = capture_joints(lambda i, t: gpt_loss(model, i, t), idx, tgt)
    return model, (idx, tgt), captured


def planned(captured, **fields):
    fields.setdefault("inner", "aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_joint(captured.joint, captured.num_fwd_outputs, RematConfig(**fields))


def planner(joint, num_fwd_outputs: int, inner: str = "aot_eager"):
    """plan(memory_budget, **fields) -> the plan plan_joint makes of `joint` under RematConfig(inner=inner,
    memory_budget=memory_budget, **fields). Neither the problem nor the plans an evaluator proposes depend on the
    budget (tests/test_fuzz.py checks that one evaluator answers as fresh ones do), so each set of other fields
    builds its problem once, with plan_joint at budget 0.0, and one evaluator answers all its budgets."""
    built: dict[tuple, tuple] = {}

    def plan(memory_budget, **fields):
        key = tuple(sorted(fields.items()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if key not in built:
                config = RematConfig(inner=inner, memory_budget=0.0, **fields)
                problem = plan_joint(copy.deepcopy(joint), num_fwd_outputs, config).problem
                built[key] = problem, Evaluator(problem, config.solver_time_limit), config.solver
            problem, evaluator, solver = built[key]
            return plan_of(problem, memory_budget, solver, evaluator)

    return plan


def test_planner_plans_as_plan_joint_does():
    model, (x,) = random_model(0, size=8, kinds=FUZZ_KINDS)  # a matmul and a dropout
    (joint, _, num_fwd), _ = trace_joint(model, x.requires_grad_())
    plan = planner(joint, num_fwd)
    for fields in (
        {"memory_budget": 0.3},
        {"memory_budget": 0.0, "rng": "save"},
        {"memory_budget": 0.0, "save_ops": ("aten.mm",)},
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            alone = plan_joint(copy.deepcopy(joint), num_fwd, RematConfig(inner="aot_eager", **fields)).plan
        assert plan(**fields) == alone, fields


def test_blocks_and_recipes_follow_the_module_structure(gpt):
    _, _, captured = gpt
    problem = planned(captured).problem
    graph = problem.graph
    found = blocks(problem)
    assert sorted(set(found.values())) == [0, 1, 2, 3]
    assert all("blocks." in graph[n].module_path for n in found)
    names = [name for name, _ in recipes(problem)]
    assert names[:2] == ["per-block checkpoint", "every-2-blocks checkpoint"]
    assert {"op-level SAC", "Megatron selective (attention core)"} <= set(names)
    per_block = dict(recipes(problem))["per-block checkpoint"]
    # Each block's output is read by the next block: saved. Everything else inside a block is recomputed.
    for name in per_block:
        v = graph[name]
        assert found[name] == found.get(v.name)
        assert all(found.get(u) == found[name] for u in v.users if graph[u].role.name == "FORWARD")
    softmaxes = [v.name for v in graph.values if v.op == "aten._softmax.default" and v.role.name == "FORWARD"]
    assert len(softmaxes) == 4 and set(softmaxes) <= per_block
    sac = dict(recipes(problem))["op-level SAC"]
    assert sac <= per_block and not any(graph[n].op in SAVED_OPS for n in sac)
    core = dict(recipes(problem))["Megatron selective (attention core)"]
    assert set(softmaxes) <= core and not any(graph[n].op in ("aten.addmm.default", "aten.mm.default") for n in core)
    assert all(".attn" in graph[n].module_path for n in core)


def test_under_inductor_every_proposal_recomputing_a_block_output_has_a_twin_saving_them(gpt):
    model, (idx, tgt), _ = gpt
    (captured,) = capture_joints(lambda i, t: gpt_loss(model, i, t), idx, tgt, inner="inductor")
    problem = planned(captured, inner="inductor").problem
    graph, found = problem.graph, blocks(problem)
    outputs = block_outputs(problem)
    # each block's residual stream out of it, read by the next block (or the head)
    residuals = {n for n in outputs if graph[n].op == "aten.add.Tensor"}
    assert sorted(found[n] for n in residuals) == [0, 1, 2, 3]
    for name in outputs:
        readers = [u for s in graph.values if s.storage == graph[name].storage for u in s.users]
        assert any(graph[u].role.name in ("FORWARD", "OUTPUT") and found.get(u) != found[name] for u in readers)
    evaluator = Evaluator(problem)
    members = family.heuristic_family(evaluator)
    proposed = {m.chosen for m in members}
    # every proposal, that is, all but the inner compiler's own plan
    recomputing = [m for m in members if m.chosen & outputs and m.label != problem.baseline.kind]
    assert recomputing and all(m.chosen - outputs in proposed for m in recomputing)
    twins = [m.label for m in members if m.label.endswith(", block outputs saved")]
    assert "op-level SAC (whole graph), block outputs saved" in twins
    # without fusion (aot_eager) a recomputed block output is no chain of inlined loops: no twins are proposed
    eager = family.heuristic_family(Evaluator(planned(gpt[2]).problem))
    assert not [m.label for m in eager if m.label.endswith(", block outputs saved")]


def test_a_recipe_plan_names_its_recipe(gpt):
    _, _, captured = gpt
    problem = planned(captured).problem
    evaluator = Evaluator(problem)
    member = next(s for s in recipe_family(problem, evaluator) if s.label == "per-block checkpoint")
    base = evaluator.baseline()
    plan = _plan(problem, evaluator, member, None, member.peak, member.peak, "auto", None)
    recomputed = [d for d in plan.decisions if d.action is remat.Action.RECOMPUTE and d.name in member.chosen]
    assert recomputed and all("(per-block checkpoint)" in d.reason for d in recomputed)
    assert member.peak < base.peak


def _peak(step, model):
    for p in model.parameters():
        p.grad = None
    return remat.peak_memory(step, exclude=lambda: [p.grad for p in model.parameters()])


def test_least_peak_is_no_higher_than_per_block_checkpoint_measured(gpt):
    model, (idx, tgt), _ = gpt
    eager = copy.deepcopy(model)

    class Checkpointed(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    for i, block in enumerate(eager.blocks):
        eager.blocks[i] = Checkpointed(block)
    hand = _peak(lambda: gpt_loss(eager, idx, tgt).backward(), eager)

    compiled_model = copy.deepcopy(model)
    step = torch.compile(
        lambda i, t: gpt_loss(compiled_model, i, t),
        backend="remat",
        options={"memory_budget": 0.0, "inner": "aot_eager"},
    )
    step(idx, tgt).backward()
    least = _peak(lambda: step(idx, tgt).backward(), compiled_model)
    plan = remat.last_plan()
    assert least <= hand, (least, hand)
    # aot_eager runs what was simulated, dropout scratch included (the loss scalar's 4 bytes aside)
    assert abs(least - plan.peak_bytes) <= 16, (least, plan.peak_bytes)
    torch._dynamo.reset()


@pytest.mark.parametrize("fraction", [0.6, 0.2])
def test_dropout_scratch_is_counted_so_fraction_budgets_hold(gpt, fraction):
    # CPU dropout allocates a float mask, its backward a float copy of the mask: counted, the measured step stays
    # within the budget and equals the simulated peak (the loss scalar's bytes aside)
    model, (idx, tgt), _ = gpt
    compiled_model = copy.deepcopy(model)
    step = torch.compile(
        lambda i, t: gpt_loss(compiled_model, i, t),
        backend="remat",
        options={"memory_budget": fraction, "inner": "aot_eager"},
    )
    step(idx, tgt).backward()
    plan = remat.last_plan()
    measured = _peak(lambda: step(idx, tgt).backward(), compiled_model)
    assert plan.recompute_flops > 0 and plan.feasible
    assert measured <= plan.budget_bytes, (measured, plan.budget_bytes)
    assert abs(measured - plan.peak_bytes) <= 16, (measured, plan.peak_bytes)
    torch._dynamo.reset()


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_replay_is_never_worse_than_save_on_gpt(gpt, fraction):
    _, _, captured = gpt
    plan = planner(captured.joint, captured.num_fwd_outputs)
    save = plan(fraction, rng="save")
    replay_least = plan(0.0, rng="replay")
    assert replay_least.peak_bytes <= plan(0.0, rng="save").peak_bytes
    at_same_bytes = plan(save.budget_bytes, rng="replay")
    assert at_same_bytes.peak_bytes <= save.budget_bytes or not save.feasible
    assert at_same_bytes.recompute_flops <= save.recompute_flops


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(50))
def test_replay_is_never_worse_than_save_on_random_graphs(seed):
    rng = random.Random(seed)
    model, (x,) = random_model(seed, size=rng.randint(6, 12), kinds=FUZZ_KINDS)
    x.requires_grad_()
    (joint, _, num_fwd), _ = trace_joint(model, x)
    plan = planner(joint, num_fwd)
    save_least, replay_least = plan(memory_budget=0.0, rng="save"), plan(memory_budget=0.0, rng="replay")
    assert replay_least.peak_bytes <= save_least.peak_bytes
    for fraction in (0.5, 0.2):
        save = plan(memory_budget=fraction, rng="save")
        replay = plan(memory_budget=save.budget_bytes, rng="replay")
        assert replay.feasible and replay.recompute_flops <= save.recompute_flops, (fraction, save.budget_bytes)


def _heavy_kinds(graph) -> list[str]:
    """The compute-heavy op kinds (matmuls, attention, convolution) the graph's forward produces, as save_ops names."""
    return sorted({v.op.rsplit(".", 1)[0] for v in graph.values if v.op in HEAVY_OPS})


def _assert_free_list_no_worse(plan, ops):
    """save_ops=() against save_ops=[ops] at the least peak and at the list's own budget in bytes."""
    listed_least = plan(memory_budget=0.0, save_ops=ops)
    assert plan(memory_budget=0.0).peak_bytes <= listed_least.peak_bytes, ops
    for fraction in (0.5, 0.0):
        listed = plan(memory_budget=fraction, save_ops=ops)
        free = plan(memory_budget=listed.budget_bytes)
        assert free.feasible or not listed.feasible, (ops, fraction)
        assert free.recompute_flops <= listed.recompute_flops, (
            ops,
            fraction,
            free.recompute_flops,
            listed.recompute_flops,
        )


def test_an_empty_save_list_is_never_worse_than_a_one_kind_list_on_gpt(gpt):
    _, _, captured = gpt
    kinds = _heavy_kinds(planned(captured, memory_budget=0.0).problem.graph)
    assert "aten.mm" in kinds, kinds
    plan = planner(captured.joint, captured.num_fwd_outputs)
    for kind in kinds:
        _assert_free_list_no_worse(plan, (kind,))


def _matmul_seeds(count: int) -> list[int]:
    """The first `count` seeds whose random model has a matmul (a heavy op kind save_ops may name)."""
    seeds = []
    for seed in range(20 * count):
        model, _ = random_model(seed, size=random.Random(seed).randint(6, 12), kinds=FUZZ_KINDS)
        if any(step[0] == "matmul" for step in model.program):
            seeds.append(seed)
        if len(seeds) == count:
            return seeds
    raise AssertionError(f"fewer than {count} random models with a matmul")


@pytest.mark.slow
@pytest.mark.parametrize("seed", _matmul_seeds(50))
def test_an_empty_save_list_is_never_worse_than_a_one_kind_list_on_random_graphs(seed):
    rng = random.Random(seed)
    model, (x,) = random_model(seed, size=rng.randint(6, 12), kinds=FUZZ_KINDS)
    x.requires_grad_()
    (joint, _, num_fwd), _ = trace_joint(model, x)
    plan = planner(joint, num_fwd)
    kinds = _heavy_kinds(plan(memory_budget=0.0).problem.graph)
    assert kinds, seed
    for kind in kinds:
        _assert_free_list_no_worse(plan, (kind,))


def test_options_that_keep_values_are_marked_and_walks_step_alike(gpt):
    """Values kept only by a save list or by rng="save" are marked as such (Constraints.by_option); a problem keeping
    them counts them back (Problem.walk_values), so the walks of the unconstrained problem, of the family's
    variants and of the user's save_ops / rng="save" problems all step by the same number of values."""
    _, _, captured = gpt
    free = planned(captured, memory_budget=0.0).problem
    listed = planned(captured, memory_budget=0.0, save_ops=("aten.mm",)).problem
    saving = planned(captured, memory_budget=0.0, rng="save").problem
    graph = free.graph
    assert not free.constraints.by_option
    mm = {n for n in listed.candidates if graph[n].op == "aten.mm.default"}
    assert mm and mm <= listed.constraints.by_option <= set(listed.constraints.must_save)
    assert {graph[n].op for n in listed.constraints.by_option} == {"aten.mm.default"}
    random_ops = set(free.constraints.replay)
    assert random_ops and random_ops <= saving.constraints.by_option
    # what rng="save" alone keeps: the random ops rng="replay" may replay and their outputs
    assert all(n in random_ops or graph[n].inputs[0] in random_ops for n in saving.constraints.by_option)
    assert len(listed.choosable) < len(free.choosable) and len(saving.choosable) < len(free.choosable)
    assert free.walk_values == len(free.choosable) == listed.walk_values == saving.walk_values
    variants = [family._random_ops_saved(free)] + [kept for _, kept in family._heavy_ops_saved(free)]
    assert len(variants) >= 3 and all(v.walk_values == free.walk_values for v in variants)


def test_a_walk_moving_several_values_per_step_proposes_the_plans_between(gpt, monkeypatch):
    """A walk step of a few values (greedy.BETWEEN at most) proposes each plan between them too, so that the walk's
    plans are as fine as one value per step; it simulates only the plans its steps end on."""
    _, _, captured = gpt
    free = planned(captured, memory_budget=0.0).problem
    monkeypatch.setattr(greedy, "MAX_STEPS", 40)
    assert 2 <= greedy.step_values(free) <= greedy.BETWEEN
    evaluator = Evaluator(free)
    walk = greedy.peak_walk(free, evaluator)
    assert not walk[0].chosen and len(walk) == len(walk[-1].chosen) + 1
    assert all(a.chosen < b.chosen for a, b in zip(walk, walk[1:]))
    simulated = [s for s in walk if s.resolved in evaluator._memo]
    assert len(walk) // 2 <= len(walk) - len(simulated)  # two values or more per step: half the plans or fewer
    assert simulated[-1] is walk[-1]


def test_a_variant_walk_follows_the_unconstrained_walk_until_it_recomputes_a_kept_value(gpt, monkeypatch):
    _, _, captured = gpt
    free = planned(captured, memory_budget=0.0).problem
    monkeypatch.setattr(greedy, "MAX_STEPS", 40)  # walks of 40 steps: each moves several values, as on larger graphs
    assert free.walk_values // greedy.max_steps(free) >= 2
    evaluator = Evaluator(free)
    walk = greedy.peak_walk(free, evaluator)
    for kind, kept in family._heavy_ops_saved(free):
        saved = set(kept.choosable) ^ set(free.choosable)
        inner = evaluator.restricted(kept)
        simulated = len(inner._memo)
        own = greedy.peak_walk(kept, inner)
        # the unconstrained walk's first step recomputing a kept value (if it ever does)
        shared = next((k for k, s in enumerate(walk) if s.chosen & saved), len(walk))
        assert shared >= 2, kind
        assert [s.resolved for s in own[:shared]] == [s.resolved for s in walk[:shared]], kind
        assert all(not (s.chosen & saved) for s in own), kind
        # the shared plans were simulated once, by the unconstrained walk; but one: a plan between two values of the
        # unconstrained walk's step (proposed, not simulated) that ends the variant's step, which lacks the kept value
        assert len(inner._memo) - simulated <= len(own) - shared + 1, kind
