"""When each storage instance is allocated and read (remat/plan/instances.py, whole-array steps), checked against a
plain step-by-step restatement on every plan the planner simulates while planning real graphs, under both inner
compilers."""

from __future__ import annotations

import copy
import warnings

import pytest

from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan import fusion, instances
from remat.plan.arrays import BACKWARD
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from random_graphs import FUZZ_KINDS, random_model


def walked(a, forward, backward, in_fw, recomputed, fuses) -> tuple:
    """instances.steps restated one step at a time: a step reads its node's inputs (under inductor, through the
    values computed inside it) and allocates its node's storage and, for a multi-output op, the outputs its module
    takes; an instance read nowhere ends where it is allocated."""
    n = len(a.names)
    alloc, last, first_bw, allocated = [-1] * (2 * n), [-1] * (2 * n), [-1] * (2 * n), []
    last_fw: list[int] = []
    start = 0
    for in_bw, (order, inside, _) in enumerate((forward, backward)):
        for pos, i in enumerate(order, start=start):
            if inside[i]:
                continue
            for j in fusion.expand(a, i, inside, {}) if fuses else a.inputs[i]:
                owner = a.storage[j]
                k = owner + n if in_bw and recomputed[owner] else a.instances[j]
                if k >= 0:
                    last[k] = pos
                    if in_bw and first_bw[k] < 0:
                        first_bw[k] = pos
            if in_bw:
                made = (i, *[g for g in a.getitems[i] if recomputed[g] or a.role[g] == BACKWARD])
            else:
                made = (i, *[g for g in a.getitems[i] if in_fw[g]])
            for m in made:
                if not a.allocates[m] or (not in_bw and inside[m]):
                    continue
                if in_bw:
                    k = m + n if recomputed[m] or a.role[m] == BACKWARD else a.instances[m]
                else:
                    k = m
                if k >= 0 and alloc[k] < 0:
                    alloc[k] = pos
                    allocated.append(k)
                    if last[k] < 0:
                        last[k] = pos
        if not in_bw:
            last_fw = list(last)
        start = len(order)
    return alloc, last_fw, last, first_bw, allocated


def recorded_steps(monkeypatch, model, inputs, inner: str) -> list:
    """(arguments, answer) of every instances.steps call made while planning `model` at two budgets."""
    calls = []
    steps = instances.steps

    def recording(*args):
        out = steps(*args)
        calls.append((copy.deepcopy(args[1:]), args[0], copy.deepcopy(tuple(out))))
        return out

    monkeypatch.setattr(instances, "steps", recording)
    (captured,) = capture_joints(model, *inputs, inner=inner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for budget in (0.3, 0.0):
            config = RematConfig(memory_budget=budget, inner=inner)
            plan_joint(captured.joint, captured.num_fwd_outputs, config)
    return calls


def gpt():
    config = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.1)
    model = GPT(config)
    return (lambda *xs: gpt_loss(model, *xs)), make_gpt_batch(config, batch=2)


CASES = {"gpt": gpt, **{f"random{seed}": (lambda seed=seed: random_model(seed, 14, FUZZ_KINDS)) for seed in range(3)}}


@pytest.mark.parametrize("inner", ["inductor", "aot_eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_steps_are_the_step_by_step_walk(case, inner, monkeypatch):
    model, inputs = CASES[case]()
    calls = recorded_steps(monkeypatch, model, inputs, inner)
    recomputing = 0
    for args, a, answer in calls:
        assert answer == walked(a, *args)
        recomputing += any(args[3])
    assert recomputing  # plans that recompute, so backward copies were allocated
    if case == "gpt":  # dropout: multi-output ops whose outputs a step allocates with it
        assert any(any(a.getitems) for _, a, _ in calls)
