"""Budgets one solver misses where another meets them: planning only, on a 6-layer MLP, a 2-layer GPT-style model
and seeded random graphs, under the aot_eager and inductor inner models.

    python benchmarks/solver_misses.py [--seeds 50] [--inner aot_eager,inductor] [--solver mincut] [--against greedy]

Each joint graph is captured once and its problem built once; then for every fraction 0.0, 0.1, ..., 1.0 the budget
is what `--against` resolves the fraction to (bytes, from its own least peak to the baseline peak), and `--solver`
plans for those same bytes. A miss is a budget `--against` meets and `--solver` does not. Prints each miss and the
count per inner model.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # the checkout's remat and the test models

from random_graphs import random_model  # noqa: E402
from remat.config import RematConfig  # noqa: E402
from remat.explain import capture_joints  # noqa: E402
from remat.pipeline import plan_joint  # noqa: E402
from remat.plan.evaluate import Evaluator  # noqa: E402
from remat.plan.solve import make_plan  # noqa: E402
from remat.zoo import GPT, MLP, GPTConfig, gpt_loss, make_gpt_batch, make_mlp_batch, mlp_loss  # noqa: E402

FRACTIONS = tuple(i / 10 for i in range(11))


def graphs(seeds: int):
    """(name, loss function, inputs) for the MLP, the GPT-style model and `seeds` random graphs."""
    mlp = MLP(width=256, depth=6)
    yield "mlp-6", lambda x: mlp_loss(mlp, x), (make_mlp_batch(256, 64),)
    config = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32, dropout=0.1)
    gpt = GPT(config)
    yield "gpt-2", lambda idx, targets: gpt_loss(gpt, idx, targets), make_gpt_batch(config, batch=2)
    for seed in range(seeds):
        model, inputs = random_model(seed, size=10 + seed % 7)
        yield f"random-{seed}", model, inputs


def problem_of(model, inputs, inner: str):
    """The planning problem of the model's joint graph (one graph per model here)."""
    (captured,) = capture_joints(model, *inputs, dynamic=False, inner=inner)
    config = RematConfig(memory_budget=None, inner=inner)
    return plan_joint(captured.joint, captured.num_fwd_outputs, config).problem


def misses(problem, solver: str, against: str) -> list[tuple[float, int, int, int]]:
    """(fraction, budget, against's peak, solver's peak) for each fraction's budget `against` meets and `solver`
    does not."""
    evaluator = Evaluator(problem)
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fraction in FRACTIONS:
            reference = make_plan(problem, "fraction", fraction, against, evaluator=evaluator)
            budget = reference.budget_bytes
            if reference.peak_bytes > budget:
                continue
            plan = make_plan(problem, "bytes", budget, solver, evaluator=evaluator)
            if plan.peak_bytes > budget:
                found.append((fraction, budget, reference.peak_bytes, plan.peak_bytes))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50, help="random graphs (seeds 0..N-1)")
    parser.add_argument("--inner", default="aot_eager,inductor")
    parser.add_argument("--solver", default="mincut")
    parser.add_argument("--against", default="greedy")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's pytree deprecations, once per capture
    total = 0
    for inner in args.inner.split(","):
        count, points, seconds = 0, 0, 0.0
        for name, model, inputs in graphs(args.seeds):
            problem = problem_of(model, inputs, inner)
            start = time.process_time()
            found = misses(problem, args.solver, args.against)
            seconds += time.process_time() - start
            points += len(FRACTIONS)
            count += len(found)
            for fraction, budget, reference, peak in found:
                print(
                    f"{inner} {name} fraction {fraction:.1f}: budget {budget}, {args.against} {reference}, "
                    f"{args.solver} {peak} (+{peak - budget})"
                )
        print(
            f"{inner}: {args.solver} misses {count} of {points} budgets {args.against} meets "
            f"({seconds:.1f} CPU s planning)"
        )
        total += count
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
