"""One byte budget for the whole step (remat/step.py): when a compiled model becomes several graphs (DDP's buckets,
graph breaks), a byte memory_budget bounds the step's measured peak, each graph is planned under what the earlier
graphs of the step leave, the split is in each Plan, and recompiles take their graph's place."""

import copy
import dataclasses
import json
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import remat
from remat.explain import explain_all
from remat.step import Slot, StepLedger
from remat.units import MIB as MiB
from ranks import TIMEOUT, report
from ranks import run as run_ranks

AOT = {"inner": "aot_eager"}


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    """Each test sees only the plans of its own compiles."""
    monkeypatch.setattr("remat.backend._plans", [])


def test_ledger_counts_earlier_graphs_and_a_recompile_takes_its_place():
    step = StepLedger()
    first = step.slot((7, 0))
    assert step.share(first, 10 * MiB, inputs=MiB) == remat.step.Share(10 * MiB, 0, 0, 0)  # the step's own inputs
    step.record(first, 3 * MiB)
    second = step.slot((7, 0))  # DDP's next bucket: the same compile of the same frame
    assert second == Slot(7, 0, 1)
    step.record(second, 2 * MiB)
    after_break = step.slot((9, 0))  # a graph break resumes in another frame
    share = step.share(after_break, 10 * MiB, inputs=MiB)
    assert (share.held, share.earlier, share.inputs, share.graph_budget) == (5 * MiB, 2, MiB, 4 * MiB)
    step.record(after_break, MiB)
    # Frame 7 recompiled (new shapes): its graphs are replaced in its place, before frame 9's.
    again = step.slot((7, 1))
    assert again == Slot(7, 1, 0) and step.share(again, 10 * MiB, 0).held == 0
    step.record(again, 4 * MiB)
    assert step.share(Slot(9, 0, 0), 10 * MiB, 0).held == 4 * MiB  # frame 7's old second graph is gone
    assert step.graphs() == 2


def test_the_same_code_compiled_for_another_module_counts_on_its_own():
    """FSDP2 compiles each block on its own: the same frame, a new compile, inputs of the same shapes. Each block's
    graph keeps its saved bytes while the next runs; new shapes replace them all."""
    step = StepLedger()
    blocks = [step.slot((3, count), "f32(8, 4)") for count in range(3)]
    assert [b.instance for b in blocks] == [0, 1, 2]
    for block in blocks:
        step.record(block, MiB)
    assert [step.share(b, 10 * MiB, 0).held for b in blocks] == [0, MiB, 2 * MiB]
    resized = step.slot((3, 3), "f32(16, 4)")  # a new batch size: a recompile, in the frame's place
    assert resized == Slot(3, 3, 0, 0) and step.graphs() == 0
    step.record(resized, 2 * MiB)
    assert step.slot((3, 4), "f32(16, 4)").instance == 1 and step.graphs() == 1


def test_share_note_names_the_split():
    share = remat.step.Share(6 * MiB, 1258291, 2, 0)
    assert share.note() == (
        "memory_budget 6.0 MiB for the step: 1.2 MiB held by 2 earlier graph(s) of this step, 4.8 MiB for this graph"
    )


def test_a_followed_graph_leaves_room_for_one_like_it():
    from remat.plan.evaluate import Scored, pick, pick_frugal

    def plan(cost, peak, saved):
        return Scored(frozenset(), None, cost, peak * MiB, saved * MiB)

    keep_all, keep_some, keep_none = plan(0, 11, 8.5), plan(350, 7, 0.5), plan(700, 11, 0)
    family = [keep_all, keep_some, keep_none]
    assert pick(family, 12 * MiB) is keep_all  # alone: the cheapest plan meeting the budget
    # followed by graphs like it (least peak 7 MiB): max(peak, saved + 7 MiB) is 15.5, 7.5 and 11 MiB
    assert pick_frugal(family, 12 * MiB, 7 * MiB) is keep_some
    assert pick_frugal(family, 16 * MiB, 7 * MiB) is keep_some  # a looser budget picks the same
    assert pick_frugal(family, 6 * MiB, 7 * MiB) is keep_some  # none fits: the least peak


class Blocks(nn.Module):
    """Residual MLP blocks: x + fc2(gelu(fc1(x))); `break_after` blocks, then a graph break."""

    def __init__(self, depth=8, width=128, break_after=None):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(depth))
        self.fc2 = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(depth))
        self.break_after = break_after

    def forward(self, x):
        split = len(self.fc1) if self.break_after is None else self.break_after
        x = self.blocks(x, 0, split)
        if self.break_after is not None:
            torch._dynamo.graph_break()  # outside the loops: dynamo resumes after it in a graph of its own
        return self.blocks(x, split, len(self.fc1))

    def blocks(self, x, start, stop):
        for fc1, fc2 in zip(self.fc1[start:stop], self.fc2[start:stop]):
            x = x + fc2(F.gelu(fc1(x)))
        return x


def train_step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss


def measured_peak(compiled, params, x) -> int:
    for p in params:
        p.grad = None
    return remat.peak_memory(lambda: train_step(compiled, x), exclude=lambda: [p.grad for p in params])


def run(module, backend, x):
    """(loss, gradients, measured peak of a second step) of `module` compiled with `backend`."""
    params = list(module.parameters())
    compiled = torch.compile(module, **backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = train_step(compiled, x)
    assert not [w for w in caught if "cannot be met" in str(w.message)]  # every graph's budget is met
    grads = [p.grad.clone() for p in params]
    return loss, grads, measured_peak(compiled, params, x)


@pytest.fixture
def one_rank_group(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs gloo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1, timeout=TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ddp_buckets_share_one_byte_budget(one_rank_group):
    budget = 12 * MiB  # above the unbucketed least peak (10 MiB), far below the baseline (38 MiB)
    x = torch.randn(1024, 128)
    remat_backend = {"backend": "remat", "options": {"memory_budget": budget, **AOT}}

    def ddp():  # 1 MiB buckets: 2 blocks each (DDPOptimizer); gradients in the buckets, so no copy is measured
        return DDP(Blocks(), bucket_cap_mb=1, gradient_as_bucket_view=True)

    loss, grads, peak = run(ddp(), remat_backend, x)
    plans = remat.recent_plans()
    assert len(plans) == 4
    ref_loss, ref_grads, _ = run(ddp(), {"backend": "aot_eager"}, x)
    assert torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    assert peak <= 1.05 * budget, (peak, [p.notes[-1] for p in plans])
    held = 0
    for k, plan in enumerate(plans):
        share = plan.step_share
        assert share.earlier == k and share.held == held and share.step_budget == budget
        assert plan.budget_bytes == share.graph_budget and plan.feasible
        held += plan.saved_bytes + (share.inputs if k else 0)  # each later graph keeps its input for backward
    # The same model unbucketed: one graph. strict=True (the budget must be met) also makes these options differ
    # from the bucketed run's, which dynamo would otherwise take for the same backend and reuse its graphs.
    strict = {"backend": "remat", "options": {"memory_budget": budget, "strict": True, **AOT}}
    with torch._dynamo.config.patch(optimize_ddp=False):
        _, _, unbucketed = run(ddp(), strict, x)
    assert len(remat.recent_plans()) == 5 and remat.last_plan().step_share.earlier == 0
    assert unbucketed <= 1.05 * budget


def ddp_worker(rank, world, out):
    # a file store in the test's own folder: no port another process could take between choosing and binding it
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world, timeout=TIMEOUT)

    def step():
        model = DDP(Blocks(), bucket_cap_mb=1, gradient_as_bucket_view=True)
        # partition= makes every graph compare its plan across the ranks (remat/plan/agree.py) as it compiles
        options = {"memory_budget": 12 * MiB, "partition": "world", **AOT}
        train_step(torch.compile(model, backend="remat", options=options), torch.randn(1024, 128))
        plans = remat.recent_plans()
        return {
            "fingerprints": [p.fingerprint() for p in plans],
            "shares": [list(dataclasses.astuple(p.step_share)) for p in plans],
            "grads": [p.grad.flatten()[:8].tolist() for p in model.parameters()],
        }

    report(out, rank, step)


def test_ranks_split_the_step_budget_alike(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs gloo")
    late = run_ranks(ddp_worker, 2, str(tmp_path))  # where ranks were at the launcher's report, if still running
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert "error" not in first and "error" not in second, (first.get("error"), second.get("error"), *late)
    assert len(first["fingerprints"]) == 4 and first["fingerprints"] == second["fingerprints"]
    assert first["shares"] == second["shares"] and [s[2] for s in first["shares"]] == [0, 1, 2, 3]
    assert first["grads"] == second["grads"]


def test_graph_break_split_shown_and_met():
    budget = 10 * MiB
    x = torch.randn(1024, 128)
    eager = Blocks(depth=4, break_after=2)
    model = copy.deepcopy(eager)
    train_step(eager, x)
    loss, grads, peak = run(model, {"backend": "remat", "options": {"memory_budget": budget, **AOT}}, x)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, eager.parameters()))
    first, second = remat.recent_plans()
    assert first.step_share.earlier == 0 and first.step_share.followed and first.budget_bytes == budget
    share = second.step_share
    assert (share.earlier, share.held, share.followed) == (1, first.saved_bytes, False)
    assert share.inputs == 1024 * 128 * 4  # the first graph's output, live while the second runs
    assert second.budget_bytes == budget - first.saved_bytes - share.inputs
    assert share.note() in second.notes and share.note() in second.summary()
    assert "held by 1 earlier graph(s) of this step" in share.note()
    assert peak <= 1.05 * budget
    explained = explain_all(Blocks(depth=4, break_after=2), x, memory_budget=budget, **AOT)
    assert [p.plan.step_share for p in explained] == [first.step_share, second.step_share]
    assert [p.plan.saved for p in explained] == [first.saved, second.saved]


def test_strict_names_the_split_when_too_little_is_left():
    compiled = remat.compile(Blocks(depth=4, break_after=2), memory_budget=4 * MiB, strict=True, **AOT)
    with pytest.raises(Exception, match=r"strict=True.*for the step: .*memory_budget=\d+ bytes for the step"):
        train_step(compiled, torch.randn(1024, 128))


def test_recompiles_take_their_graphs_place():
    budget = 10 * MiB
    compiled = torch.compile(
        Blocks(depth=4, break_after=2), backend="remat", dynamic=False, options={"memory_budget": budget, **AOT}
    )
    for rows in (1024, 512, 256):  # each size recompiles both graphs
        train_step(compiled, torch.randn(rows, 128))
        first, second = remat.recent_plans()[-2:]
        assert first.step_share.earlier == 0
        assert second.step_share.earlier == 1 and second.step_share.held == first.saved_bytes
    assert len(remat.recent_plans()) == 6


def test_fractions_resolve_per_graph():
    compiled = remat.compile(Blocks(depth=4, break_after=2), memory_budget=0.5, **AOT)
    train_step(compiled, torch.randn(256, 128))
    plans = remat.recent_plans()
    assert len(plans) == 2 and all(p.step_share is None for p in plans)
    assert all(
        p.budget_bytes == int(p.least_peak_bytes + 0.5 * (p.baseline.peak_bytes - p.least_peak_bytes)) for p in plans
    )
