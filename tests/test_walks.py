"""Resolving a choice continues from walks made before (plan/walks.py): on seeded random graphs and a GPT-style
model, every resolve in a mixed sequence of growing, shrinking and unrelated recompute sets gives the plan a walk
from nothing gives, and a walk grown from a kept one walks fewer values."""

import random
import warnings
from unittest import mock

import pytest

from random_graphs import random_model
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.plan import walks
from remat.plan.arrays import FORWARD, PRIMAL
from remat.plan.problem import Problem, Resolved
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch


def problem_of(fn, inputs) -> Problem:
    (captured,) = capture_joints(fn, *inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_joint(captured.joint, captured.num_fwd_outputs, RematConfig(memory_budget=None)).problem


def walk_from_nothing(p: Problem, recompute: frozenset[int]) -> Resolved:
    """The walk of the module docstring, from what backward reads, written out plainly."""
    a = p.arrays
    saved, recomputed, inputs = set(), set(), set(p.needed_inputs)
    seen: set[int] = set()
    stack = [a.index[n] for n in p.needed]
    while stack:
        i = stack.pop()
        if i in seen or a.role[i] not in (FORWARD, PRIMAL):
            continue
        seen.add(i)
        if a.role[i] == PRIMAL:
            inputs.add(a.names[i])
        elif i in recompute:
            recomputed.add(a.names[i])
            stack.extend(a.inputs[i])
        else:
            saved.add(a.names[i])
    offloaded, sharded = p._transfers(frozenset(saved))
    return Resolved(frozenset(saved), frozenset(recomputed), frozenset(inputs), offloaded, sharded)


def sequence(p: Problem, rng: random.Random) -> list[frozenset[int]]:
    """Recompute sets as the solvers ask for them: rankings' prefixes (growing), restarts from less (shrinking),
    and random sets."""
    choosable = [p.arrays.index[n] for n in p.choosable]
    order = choosable[:]
    rng.shuffle(order)
    out = [frozenset(order[:k]) for k in range(0, len(order) + 1, max(1, len(order) // 6))]
    out += [frozenset(order[: len(order) // 3])]
    out += [frozenset(rng.sample(choosable, rng.randrange(len(choosable) + 1))) for _ in range(6)]
    out += [frozenset(order[:k]) for k in range(len(order), -1, -max(1, len(order) // 4))]
    return out + out[::3]


@pytest.mark.parametrize("seed", range(8))
def test_every_resolve_is_the_walk_from_nothing_on_random_graphs(seed):
    model, inputs = random_model(seed, size=10 + seed % 7)
    p = problem_of(model, inputs)
    for recompute in sequence(p, random.Random(seed)):
        assert p.resolve_recomputing(recompute) == walk_from_nothing(p, recompute)


def test_resolve_is_the_walk_from_nothing_on_a_gpt_model_and_grows_from_kept_walks():
    config = GPTConfig(n_layer=2, d_model=64, n_head=2, seq_len=32, vocab=64)
    model = GPT(config, seed=0)
    idx, tgt = make_gpt_batch(config, 2)
    p = problem_of(lambda i, t: gpt_loss(model, i, t), (idx, tgt))
    index = p.arrays.index
    fresh = walks.Walks(p.arrays, tuple(index[n] for n in p.needed))
    grown = []
    original = walks.Walks._walk

    def counting(self, start, recompute, stack):
        found = original(self, start, recompute, stack)
        if self is fresh:
            grown.append((len(start.recompute), sum(found.seen) - sum(start.seen)))
        return found

    order = [index[n] for n in p.choosable]
    with mock.patch.object(walks.Walks, "_walk", counting):
        for k in range(0, len(order) + 1, 3):
            recompute = frozenset(order[:k])
            found = fresh.walk(recompute)
            expected = walk_from_nothing(p, recompute)
            assert {p.arrays.names[i] for i in found.recomputed} == expected.recomputed
            assert {p.arrays.names[i] for i in found.saved} == expected.saved
            assert p.resolve_recomputing(recompute) == expected
    # after the first, each prefix starts from the one before and walks only what its new values reach: the values
    # walked add up to the last walk's less the first's
    assert len(grown) > 2 and all(start > 0 for start, _ in grown[1:])
    last = fresh.walk(frozenset(order[: (len(order) // 3) * 3]))
    first = fresh.walk(frozenset(order[:3]))
    assert sum(found for _, found in grown[1:]) == sum(last.seen) - sum(first.seen)
