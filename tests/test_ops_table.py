"""runtime/table.py is the one declaration of each checkpoint op: the registered ops, the actions that move saved
values, the profile keys, and what the rewrite and the simulation do with a move all come from it."""

import copy
import dataclasses

import pytest
import torch

import remat
from remat.annotate import Action
from remat.plan.check import check_plan
from remat.plan.evaluate import Evaluator
from remat.plan.plan import KEPT
from remat.plan.problem import build_problem
from remat.plan.solve import make_plan
from remat.plan.transfer import Transfer
from remat.runtime import table
from remat.runtime.profile import StepRecord
from test_runtime import cuda_chain

MIB = 2**20


def test_every_registered_remat_op_has_exactly_one_entry():
    # torch lists every registered op by qualified name (a private call; tests are outside remat's torch boundary).
    registered = sorted(
        name.split("::")[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith(f"{table.NAMESPACE}::")
    )
    declared = [op.name for op in table.OPS]
    assert len(set(declared)) == len(declared)
    assert registered == sorted(declared)
    for op in table.OPS:
        assert op.overload.name() == f"{table.NAMESPACE}::{op.name}"


X = torch.arange(15.0).view(3, 5)
SAMPLES = {
    "offload": (X,),
    "reload": (X, torch.device("cpu")),
    "shard": (X, 1, 2),
    "arena_store": (X, -7, 1),
    "mark": (X, -1, "recompute0", "recompute", 0, True),
}


@pytest.mark.parametrize("op", table.OPS, ids=lambda op: op.name)
def test_each_ops_fake_implementation_agrees_with_its_kernel(op):
    """The fake implementation declared in the table is the one torch.library runs, and it matches the kernel."""
    assert torch.library.opcheck(op.overload, SAMPLES[op.name], test_utils=("test_faketensor",)) == {
        "test_faketensor": "SUCCESS"
    }


def test_every_action_that_moves_a_value_has_exactly_one_move():
    in_place = {Action.SAVE, Action.RECOMPUTE, Action.PREFER_SAVE, Action.PREFER_RECOMPUTE}
    moving = [Action(action) for action in table.MOVES]
    assert sorted(moving, key=lambda a: a.value) == sorted(set(Action) - in_place, key=lambda a: a.value)
    assert all(move.action == action for action, move in table.MOVES.items())
    assert KEPT == (Action.SAVE, *moving)
    assert Action.SHARD is Action.PARTITION and table.MOVES[Action.SHARD.value] is table.SHARDING


def test_profile_keys_are_the_tables():
    assert tuple(StepRecord().seconds) == tuple(StepRecord().bytes) == table.PROFILE_KEYS
    assert table.PROFILE_KEYS == ("recompute", "offload", "reload", "shard", "gather", "pack")
    for move in table.MOVES.values():
        assert move.forward[0].profile in table.PROFILE_KEYS and move.profile in table.PROFILE_KEYS
    # offload's chain is remat::reload, timed by its kernel; a gather is torch's collectives, timed by marks
    assert not table.OFFLOADING.marked and table.SHARDING.marked


def test_kept_bytes_and_shard_sizes():
    assert [table.shard_numel(n, 2) for n in (15, 16, 1)] == [8, 8, 1]
    assert table.SHARDING.kept(15 * 4, 4, "cpu", 2) == 8 * 4
    assert table.OFFLOADING.kept(MIB, 4, "cpu", 1) == MIB  # on CPU the host copy is in device memory
    assert table.OFFLOADING.kept(MIB, 4, "cuda", 1) == 0


def test_simulation_and_decisions_read_a_moves_kept_bytes(monkeypatch):
    """Change what the offload move keeps on the device and the simulated saved bytes and peak, the decision rows
    and the plan's invariant checks all follow: none of them sizes a kept form on its own."""
    graph, costs, constraints = cuda_chain()
    problem = build_problem(graph, costs, constraints, Transfer(offload=True))
    before = Evaluator(problem).score(())
    saved, peak = before.saved, before.peak  # simulated now, under the table as it is (a Scored simulates when read)
    offloaded = before.resolved.offloaded
    assert len(offloaded) == 6  # the chain's six 1 MiB values
    quarter = dataclasses.replace(table.OFFLOADING, kept=lambda nbytes, itemsize, device, world: nbytes // 4)
    monkeypatch.setitem(table.MOVES, "offload", quarter)
    after = Evaluator(problem).score(())
    assert after.resolved == before.resolved
    assert after.saved == saved + 6 * MIB // 4
    assert after.peak > peak
    plan = make_plan(problem, "none", None)
    rows = [d for d in plan.decisions if d.action is Action.OFFLOAD]
    assert sorted(d.name for d in rows) == sorted(offloaded)
    assert all(d.kept == d.nbytes // 4 == MIB // 4 for d in rows)
    assert plan.saved_bytes == after.saved
    check_plan(plan)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).sum()


def test_the_rewrite_inserts_a_moves_chain_from_the_table(monkeypatch):
    """A step added to the offload move's backward chain appears after every reload, with the move's mark, and the
    gradients stay those of the uncompiled model."""
    chain = table.OFFLOADING.backward + ((torch.ops.aten.clone.default, lambda p, s: (p,)),)
    monkeypatch.setitem(table.MOVES, "offload", dataclasses.replace(table.OFFLOADING, backward=chain))
    torch.manual_seed(0)
    model, x = Net(), torch.randn(16, 64)
    compiled = torch.compile(copy.deepcopy(model), backend="remat", options={"inner": "aot_eager", "offload": True})
    compiled(x).backward()
    model(x).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), compiled.parameters()))
    offloaded = remat.last_plan().offloaded
    _, bw = remat.last_graphs()
    reloads = bw.graph.find_nodes(op="call_function", target=table.RELOAD.overload)
    assert len(reloads) == len(offloaded) > 0
    for reload in reloads:
        (clone,) = reload.users
        assert clone.target is torch.ops.aten.clone.default
        assert clone.meta["remat_rewrite"] == reload.meta["remat_rewrite"] == ("reload", reload.args[0].name)
