"""Small reference models for the demo, the tests and the benchmarks.

Two workloads, both built from plain ops so the joint graph a backend sees is easy to read:

- ``GPT``: a pre-LayerNorm decoder-only transformer. Attention is written out (qkv projection, ``q @ k^T``,
  causal ``masked_fill``, softmax, dropout, ``@ v``) instead of ``F.scaled_dot_product_attention``, so every
  activation and every dropout is a separate node. Dropout makes it the workload where a wrong recomputation of a
  random op shows up as wrong gradients.
- ``MLP``: a stack of ``Linear + GELU`` pairs; big matmuls, no randomness.
- ``Llama``: a Llama-style decoder (RMSNorm, rotary position embedding, SwiGLU MLP, no bias, no dropout) whose
  attention is ``F.scaled_dot_product_attention``, as current models write it.

Everything is deterministic from a seed and leaves the global RNG state as it found it: weights are drawn from a
local ``torch.Generator`` and module construction runs inside ``torch.random.fork_rng``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "gpt_loss", "make_gpt_batch", "MLP", "mlp_loss", "make_mlp_batch", "Llama"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a ``GPT``; the defaults are the benchmark model (about 3.5M parameters)."""

    vocab: int = 512
    """Vocabulary size (token ids are in ``[0, vocab)``)."""
    n_layer: int = 4
    """Number of transformer blocks."""
    d_model: int = 256
    """Width of the residual stream."""
    n_head: int = 4
    """Attention heads; must divide ``d_model``."""
    seq_len: int = 256
    """Longest sequence the position embedding and the causal mask cover."""
    dropout: float = 0.1
    """Dropout probability on attention probabilities, attention output and MLP output; 0.0 = no randomness."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of ``d_model``."""


def _init_weights(model: nn.Module, seed: int, std: float) -> None:
    """Init from a local generator: Linear/Embedding weights N(0, std), biases 0, LayerNorm (1, 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std, generator=gen)
                bias = getattr(module, "bias", None)  # nn.Embedding has none
                if bias is not None:
                    nn.init.zeros_(bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


class CausalSelfAttention(nn.Module):
    causal_mask: torch.Tensor  # a buffer
    """Multi-head causal self-attention written with plain ops (no fused SDPA kernel)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(f"GPTConfig: n_head={config.n_head} must divide d_model={config.d_model}")
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.attn_drop = nn.Dropout(config.dropout)
        self.resid_drop = nn.Dropout(config.dropout)
        # True above the diagonal: the future positions a query may not attend to. A buffer, not a parameter,
        # and not part of the state dict (it is derived from seq_len).
        mask = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("causal_mask", mask.view(1, 1, config.seq_len, config.seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        head_dim = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.reshape(B, T, self.n_head, head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = k.reshape(B, T, self.n_head, head_dim).transpose(1, 2)
        v = v.reshape(B, T, self.n_head, head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        att = att.masked_fill(self.causal_mask[:, :, :T, :T], float("-inf"))
        att = self.attn_drop(att.softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, hidden),
            nn.GELU(),
            nn.Linear(hidden, config.d_model),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(idx)`` maps int64 token ids ``(B, T)`` to logits ``(B, T, vocab)``.

    ``blocks`` is an ``nn.ModuleList`` so each block can be wrapped (checkpointed) on its own.
    """

    def __init__(self, config: GPTConfig = GPTConfig(), seed: int = 0) -> None:
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):  # default inits draw from the global RNG: keep it untouched
            self.tok_emb = nn.Embedding(config.vocab, config.d_model)
            self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab, bias=False)
        _init_weights(self, seed, std=0.02)  # GPT-2's init

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.config.seq_len:
            raise ValueError(f"GPT: sequence length {T} exceeds GPTConfig.seq_len={self.config.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(f"GPTConfig: n_head={config.n_head} must divide d_model={config.d_model}")
        self.n_head = config.n_head
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        shape = (B, T, self.n_head, C // self.n_head)
        q = _rotate(self.q_proj(x).view(shape).transpose(1, 2), cos, sin)
        k = _rotate(self.k_proj(x).view(shape).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class LlamaBlock(nn.Module):
    """``x + attn(norm(x))`` then ``x + down(silu(gate(norm(x))) * up(norm(x)))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.d_model * 2 // 3
        self.attn_norm = RMSNorm(config.d_model)
        self.self_attn = LlamaAttention(config)
        self.mlp_norm = RMSNorm(config.d_model)
        self.gate_proj = nn.Linear(config.d_model, hidden, bias=False)
        self.up_proj = nn.Linear(config.d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    cos: torch.Tensor  # buffers: the rotary embedding's angles
    sin: torch.Tensor
    """Llama-style decoder; ``forward(idx)`` maps token ids ``(B, T)`` to logits. ``config.dropout`` is unused."""

    def __init__(self, config: GPTConfig = GPTConfig(dropout=0.0), seed: int = 0) -> None:
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):
            self.embed = nn.Embedding(config.vocab, config.d_model)
            self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layer))
            self.norm = RMSNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab, bias=False)
        _init_weights(self, seed, std=0.02)
        head_dim = config.d_model // config.n_head
        freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(config.seq_len, dtype=torch.float32), freq).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.config.seq_len:
            raise ValueError(f"Llama: sequence length {T} exceeds GPTConfig.seq_len={self.config.seq_len}")
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


def gpt_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model(idx)`` against ``targets``; a scalar."""
    logits = model(idx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_gpt_batch(config: GPTConfig, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``(idx, targets)``, both int64 ``(batch, seq_len)``; targets are idx shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab, (batch, config.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class MLP(nn.Module):
    """``depth`` blocks of ``Linear(width, width) + GELU``.

    ``layers`` is an ``nn.Sequential`` whose items are the ``Linear + GELU`` pairs (each itself an
    ``nn.Sequential``), so each pair can be wrapped (checkpointed) as one block.
    """

    def __init__(self, width: int = 1024, depth: int = 8, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)))
        _init_weights(self, seed, std=math.sqrt(2.0 / width))  # He init: activations keep their scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def mlp_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Mean of the squared output; a scalar."""
    return model(x).square().mean()


def make_mlp_batch(width: int, batch: int, seed: int = 0) -> torch.Tensor:
    """Standard-normal float32 input ``(batch, width)``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=gen)
