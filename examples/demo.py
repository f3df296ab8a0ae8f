"""remat demo: fit a GPT-style training step into memory budgets stated in bytes.

bash scripts/demo.sh                  # aot_eager inner compiler: quick on a CPU
bash scripts/demo.sh --inner inductor # the default inner compiler (slow first compile on CPU)
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import remat
from remat.units import MIB
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch


class Step(torch.nn.Module):
    """The model and its loss, compiled together so the loss's activations are planned too."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return gpt_loss(self.model, idx, targets)


def train_step(module, batch, seed=0):
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(*batch)
    loss.backward()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inner", default="aot_eager", choices=["aot_eager", "inductor", "eager"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rows", type=int, default=12, help="plan-table rows to print per budget")
    args = parser.parse_args()

    config = GPTConfig(n_layer=4, d_model=256, n_head=4, seq_len=256, dropout=0.1)
    base = Step(GPT(config))
    batch = make_gpt_batch(config, batch=args.batch)
    train_step(base, batch)
    reference = {n: p.grad.clone() for n, p in base.named_parameters()}
    print(
        f"GPT-style model: {config.n_layer} layers, d{config.d_model}, seq {config.seq_len}, batch {args.batch}, "
        f"dropout {config.dropout}; inner compiler {args.inner}\n"
    )

    results = []
    for budget in (None, 0.5, "60MiB", 0.0):
        torch._dynamo.reset()
        module = copy.deepcopy(base)
        compiled = torch.compile(module, backend="remat", options={"memory_budget": budget, "inner": args.inner})
        train_step(compiled, batch)  # compiles and plans
        plan = remat.last_plan()
        measured = remat.peak_memory(
            lambda: train_step(compiled, batch), exclude=lambda: [p.grad for p in module.parameters()]
        )
        start = time.perf_counter()
        train_step(compiled, batch)
        ms = (time.perf_counter() - start) * 1e3
        same = all(torch.equal(p.grad, reference[n]) for n, p in module.named_parameters())
        print(f"== memory_budget={budget!r}")
        print(plan.table(max_rows=args.rows))
        print()
        results.append((budget, plan, measured, ms, same))

    print(
        f"{'budget':>10} {'budget MiB':>10} {'saved MiB':>9} {'sim peak MiB':>12} {'measured MiB':>12} "
        f"{'recompute MFLOP':>15} {'step ms':>8}  grads == eager"
    )
    for budget, plan, measured, ms, same in results:
        b = "-" if plan.budget_bytes is None else f"{plan.budget_bytes / MIB:.1f}"
        print(
            f"{budget!r:>10} {b:>10} {plan.saved_bytes / MIB:>9.1f} {plan.peak_bytes / MIB:>12.1f} "
            f"{measured / MIB:>12.1f} {plan.recompute_flops / 1e6:>15.0f} {ms:>8.0f}  {same}"
        )


if __name__ == "__main__":
    main()
