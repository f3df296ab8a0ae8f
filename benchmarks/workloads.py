"""The benchmark's models: each a model, its inputs and its loss, deterministic from a seed.

- ``gpt``: remat's own GPT-style model (``remat.zoo.GPT``), attention written out with plain ops.
- ``mlp``: ``remat.zoo.MLP``, big matmuls and no randomness.
- ``llama``: ``remat.zoo.Llama``, a Llama-style decoder (RMSNorm, rotary, SwiGLU, SDPA attention, no dropout).
- ``gpt2``: Hugging Face transformers' ``GPT2LMHeadModel`` from a small ``GPT2Config`` with random weights (nothing
  is downloaded), eager attention; the model a user would bring, with HF's own module structure and calling
  conventions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from remat import zoo


@dataclass(frozen=True)
class Workload:
    """A model, its inputs and its loss; every row trains a deep copy of ``model`` on ``inputs``."""

    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    loss_fn: Callable[..., torch.Tensor]
    """``loss_fn(model, *inputs)`` -> scalar loss."""
    blocks_attr: str
    """Dotted attribute path of ``model`` to the blocks that ``eager+checkpoint`` wraps one by one."""
    shape: str
    """Human-readable description for the report."""

    def blocks(self, model: nn.Module) -> nn.ModuleList | nn.Sequential:
        """The checkpointable blocks of ``model`` (a copy of ``self.model``)."""
        for name in self.blocks_attr.split("."):
            model = getattr(model, name)
        return model


def gpt_workload(batch: int, seed: int = 0) -> Workload:
    config = zoo.GPTConfig()
    shape = (
        f"GPT {config.n_layer} layers d{config.d_model} {config.n_head} heads seq {config.seq_len} "
        f"batch {batch} dropout {config.dropout}"
    )
    return Workload(
        "gpt", zoo.GPT(config, seed=seed), zoo.make_gpt_batch(config, batch, seed=seed), zoo.gpt_loss, "blocks", shape
    )


def llama_workload(batch: int, seed: int = 0) -> Workload:
    config = zoo.GPTConfig(dropout=0.0)
    shape = (
        f"Llama-style {config.n_layer} layers d{config.d_model} {config.n_head} heads seq {config.seq_len} "
        f"batch {batch} (RMSNorm, rotary, SwiGLU, SDPA, no dropout)"
    )
    return Workload(
        "llama",
        zoo.Llama(config, seed=seed),
        zoo.make_gpt_batch(config, batch, seed=seed),
        zoo.gpt_loss,
        "layers",
        shape,
    )


def mlp_workload(batch: int, seed: int = 0, width: int = 1024, depth: int = 8) -> Workload:
    shape = f"MLP {depth} x (Linear({width}) + GELU) batch {batch}"
    return Workload(
        "mlp",
        zoo.MLP(width, depth, seed=seed),
        (zoo.make_mlp_batch(width, batch, seed=seed),),
        zoo.mlp_loss,
        "layers",
        shape,
    )


# The GPT-style model's shape, so the two transformers compare: 4 layers, d256, 4 heads, seq 256, dropout 0.1.
GPT2_CONFIG = {
    "n_layer": 4,
    "n_embd": 256,
    "n_head": 4,
    "n_positions": 256,
    "vocab_size": 512,
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
}


def gpt2_workload(batch: int, seed: int = 0) -> Workload:
    """HF ``GPT2LMHeadModel`` with random weights; loss = next-token cross-entropy, computed outside HF's ``labels``
    path so every model's loss has the same form."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise ImportError("the gpt2 benchmark model needs Hugging Face transformers: pip install transformers") from e
    # Eager attention keeps softmax and dropout as separate graph nodes (as in the GPT-style model); no KV cache in
    # training; no bos/eos ids (the default 50256 lies outside this small vocabulary).
    config = GPT2Config(
        **GPT2_CONFIG, use_cache=False, bos_token_id=None, eos_token_id=None, attn_implementation="eager"
    )
    with torch.random.fork_rng(devices=[]):  # HF draws its init from the global RNG: seed it, then restore it
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.train()  # dropout on
    idx, targets = zoo.make_gpt_batch(
        zoo.GPTConfig(vocab=config.vocab_size, seq_len=config.n_positions), batch, seed=seed
    )
    shape = (
        f"HF transformers GPT2LMHeadModel (random weights, eager attention) {config.n_layer} layers "
        f"d{config.n_embd} {config.n_head} heads seq {config.n_positions} batch {batch} dropout "
        f"{config.resid_pdrop}"
    )
    return Workload("gpt2", model, (idx, targets), gpt2_loss, "transformer.h", shape)


def gpt2_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of the HF model's logits against ``targets`` (idx shifted by one)."""
    logits = model(input_ids=idx).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def on_device(workload: Workload, device: str) -> Workload:
    """The workload with its model and inputs moved to ``device``."""
    if device == "cpu":
        return workload
    inputs = tuple(t.to(device) for t in workload.inputs)
    return dataclasses.replace(workload, model=workload.model.to(device), inputs=inputs)


# name -> (factory, (normal batch, quick batch))
WORKLOADS: dict[str, tuple[Callable[..., Workload], tuple[int, int]]] = {
    "gpt": (gpt_workload, (8, 2)),
    "mlp": (mlp_workload, (2048, 256)),
    "gpt2": (gpt2_workload, (8, 2)),
    "llama": (llama_workload, (8, 2)),
}
