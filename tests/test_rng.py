"""RNG-safe replay: random ops recomputed in backward draw the forward's numbers; the generator ends where the
uncompiled step leaves it."""

import copy

import pytest
import torch

import remat

STATE = torch.get_rng_state().numel()  # bytes of the CPU generator state a replay keeps


class Dropouts(torch.nn.Module):
    """Dropout(0.5) applied 5 times to a 20000-element input (scaled by a weight so it has gradients)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(20000))
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        y = x * self.w
        for _ in range(5):
            y = self.drop(y)
        return y.sum()


class SigmoidDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x):
        return torch.sigmoid(torch.nn.functional.dropout(torch.sigmoid(self.lin(x)), 0.5)).sum()


class Randn(torch.nn.Module):
    """randn inside the part a low budget recomputes."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(128, 128))

    def forward(self, x):
        h = torch.tanh(x @ self.w)
        noisy = h * torch.randn_like(h)
        return torch.cos(noisy @ self.w).sum()


def run(module, inputs, seed=7):
    torch.manual_seed(seed)
    loss = module(*inputs)
    loss.backward()
    after = torch.rand(8)
    return loss.detach(), [p.grad.clone() for p in module.parameters()], after


def assert_bitwise(model, inputs, **options):
    expected = run(copy.deepcopy(model), inputs)
    compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", **options})
    got = run(compiled, inputs)
    assert torch.equal(got[0], expected[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert torch.equal(got[2], expected[2])  # the next random numbers too
    return remat.last_plan()


@pytest.mark.parametrize("budget", [0.0, 0.5])
def test_dropout_chain_bitwise(budget):
    torch.manual_seed(0)
    assert_bitwise(Dropouts(), (torch.randn(20000),), memory_budget=budget)


def test_dropout_chain_replayed_under_a_policy_saves_only_generator_states():
    # Force every random op's outputs to be recomputed: five generator states are all that is saved — no mask
    # (20000 bools each), no dropout output — and the step is still bitwise equal.
    torch.manual_seed(0)
    policy = lambda node: remat.Action.RECOMPUTE if node.op == "getitem" else None  # noqa: E731
    plan = assert_bitwise(Dropouts(), (torch.randn(20000),), memory_budget=0.0, policy=policy)
    assert plan.saved_bytes == 5 * STATE
    assert [d.op for d in plan.decisions if d.action is remat.Action.SAVE] == ["rng state"] * 5
    assert all(d.action is remat.Action.RECOMPUTE for d in plan.decisions if d.dtype == "bool")


def test_dropout_chain_simulated_peak_is_the_measured_peak():
    # CPU dropout draws its mask as a float tensor the size of its output: the simulation counts that scratch and
    # the outputs a multi-output op allocates at once, so the measured peak is the simulated one to the byte.
    torch.manual_seed(0)
    model, x = Dropouts(), torch.randn(20000)
    for rng in ("replay", "save"):
        compiled = torch.compile(
            copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", "memory_budget": 0.0, "rng": rng}
        )
        compiled(x).backward()
        params = list(compiled.parameters())
        measured = remat.peak_memory(lambda: compiled(x).backward(), exclude=lambda: [p.grad for p in params])
        assert measured == remat.last_plan().peak_bytes, rng


def test_dropout_chain_rng_save_keeps_masks():
    torch.manual_seed(0)
    plan = assert_bitwise(Dropouts(), (torch.randn(20000),), memory_budget=0.0, rng="save")
    masks = [d for d in plan.decisions if d.dtype == "bool"]
    assert len(masks) == 5 and all(d.action is remat.Action.SAVE for d in masks)
    assert plan.saved_bytes >= 5 * 20000


@pytest.mark.parametrize("budget", [0.0, 0.5, None])
def test_sigmoid_dropout_sigmoid_bitwise(budget):
    torch.manual_seed(0)
    assert_bitwise(SigmoidDropout(), (torch.randn(64, 256),), memory_budget=budget)


def test_randn_in_recomputed_part_bitwise():
    torch.manual_seed(0)
    # Backward reads the noise itself; the policy makes it recomputed rather than saved.
    policy = lambda node: remat.Action.RECOMPUTE if node.op.startswith("aten.randn") else None  # noqa: E731
    plan = assert_bitwise(Randn(), (torch.randn(64, 128),), memory_budget=0.0, policy=policy)
    replayed = [d for d in plan.decisions if d.op == "aten.randn_like.default"]
    assert replayed and replayed[0].action is remat.Action.RECOMPUTE
    assert "replayed" in replayed[0].reason


def test_replay_state_rows_are_in_the_totals():
    torch.manual_seed(0)
    policy = lambda node: remat.Action.RECOMPUTE if node.op == "getitem" else None  # noqa: E731
    plan = remat.explain(Dropouts(), torch.randn(20000), memory_budget=0.0, policy=policy, inner="aot_eager")
    states = [d for d in plan.decisions if d.op == "rng state"]
    assert len(states) == 5 and all(d.nbytes == STATE for d in states)
    assert sum(d.kept for d in plan.decisions) == plan.saved_bytes
    assert "rng state" in plan.table()


@pytest.mark.inductor
def test_inductor_own_random_ops_replay_from_their_seeds():
    # inductor draws from seeds it makes once per forward; recomputing from the same seeds gives the same numbers,
    # so a plan that redraws the mask matches the plan that saves it.
    torch.manual_seed(0)
    model, x = SigmoidDropout(), torch.randn(64, 256)
    saved = run(torch.compile(copy.deepcopy(model), backend="remat"), (x,))
    plan_all = remat.last_plan()

    def draws(info):  # the mask and the draw it compares: recomputed from the forward's seeds
        return remat.Action.RECOMPUTE if info.op in ("aten.gt.Scalar", "prims.inductor_random.default") else None

    recomputed = run(
        torch.compile(copy.deepcopy(model), backend="remat", options={"memory_budget": 0.0, "policy": draws}), (x,)
    )
    plan = remat.last_plan()
    assert any("inductor_random" in d.op and d.action is remat.Action.RECOMPUTE for d in plan.decisions)

    def saved_masks(p):
        return [d for d in p.decisions if d.dtype == "bool" and d.action is remat.Action.SAVE]

    assert saved_masks(plan_all) and not saved_masks(plan)  # the mask is redrawn from the seed instead of kept
    torch.testing.assert_close(recomputed[0], saved[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(recomputed[1], saved[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.inductor
def test_under_inductor_eager_random_ops_replay_and_match_eager():
    # with fallback_random inductor calls eager's random ops; a replayed one saves the generator state and draws in
    # one call, so backward redraws the forward's mask: no mask is kept and every number matches the eager step.
    torch.manual_seed(0)
    model, x = Dropouts(), torch.randn(20000)
    expected = run(copy.deepcopy(model), (x,))
    with torch._inductor.config.patch(fallback_random=True):
        policy = lambda node: remat.Action.RECOMPUTE if node.op == "getitem" else None  # noqa: E731
        got = run(
            torch.compile(copy.deepcopy(model), backend="remat", options={"memory_budget": 0.0, "policy": policy}), (x,)
        )
    plan = remat.last_plan()
    masks = [d for d in plan.decisions if d.dtype == "bool"]
    assert masks and all(d.action is remat.Action.RECOMPUTE for d in masks)
    assert [d.op for d in plan.decisions if d.action is remat.Action.SAVE].count("rng state") == 5
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(got[1], expected[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[2], expected[2])  # the generator ends where the eager step leaves it
