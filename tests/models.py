"""Tiny real architectures for the parity matrix: random weights, nothing downloaded, each compiles in seconds.

Every builder returns a `Case`: a module whose forward returns the scalar training loss, and the inputs of one step.
Hugging Face models come from `transformers` configs. ResNet and ViT are built here rather than taken from timm:
timm imports torchvision, and the torchvision wheel that matches torch 2.13 is a CUDA build that does not import
against the CPU torch (its ops library needs libc10_cuda). The modules below follow timm's layouts — BasicBlock
ResNet with BatchNorm, pre-norm ViT with a class token and fused SDPA — at toy sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Case:
    model: nn.Module
    inputs: tuple
    dropout: bool  # the model draws random numbers in training mode
    batchnorm: bool  # the model updates running statistics in training mode


def _ids(vocab: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


class CausalLM(nn.Module):
    """Next-token loss of a Hugging Face causal LM (labels= makes the model shift and reduce)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


class LabelledLM(nn.Module):
    """A model whose loss takes separate labels: masked LM (BERT), sequence to sequence (T5)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        return self.lm(input_ids=ids, labels=labels).loss


def gpt2() -> Case:
    t = _quiet_transformers()
    torch.manual_seed(0)  # transformers initialises weights from the global generator
    config = t.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=32,
        vocab_size=128,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )  # dropout 0.1 on embd, attn, resid
    return Case(CausalLM(t.GPT2LMHeadModel(config)), (_ids(128, (2, 16), 1),), dropout=True, batchnorm=False)


def bert() -> Case:
    t = _quiet_transformers()
    torch.manual_seed(0)
    config = t.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=32,
    )  # hidden and attention dropout 0.1
    ids = _ids(128, (2, 16), 2)
    labels = torch.where(torch.arange(16) % 4 == 0, ids, torch.full_like(ids, -100))  # a quarter are masked targets
    return Case(LabelledLM(t.BertForMaskedLM(config)), (ids, labels), dropout=True, batchnorm=False)


def llama() -> Case:
    t = _quiet_transformers()
    torch.manual_seed(0)
    config = t.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=32,
        attention_dropout=0.1,
        attn_implementation="sdpa",
    )  # rotary embeddings, RMSNorm, grouped-query SDPA
    return Case(CausalLM(t.LlamaForCausalLM(config)), (_ids(128, (2, 16), 3),), dropout=True, batchnorm=False)


def t5() -> Case:
    t = _quiet_transformers()
    torch.manual_seed(0)
    config = t.T5Config(
        num_layers=2,
        num_decoder_layers=2,
        d_model=64,
        d_kv=16,
        num_heads=4,
        d_ff=128,
        vocab_size=128,
        dropout_rate=0.1,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return Case(
        LabelledLM(t.T5ForConditionalGeneration(config)),
        (_ids(128, (2, 16), 4), _ids(128, (2, 8), 5)),
        dropout=True,
        batchnorm=False,
    )


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """Stem conv + BN + ReLU + max-pool, then BasicBlocks (one downsampling), global average pool, linear head."""

    def __init__(self, widths=(8, 16), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(), nn.MaxPool2d(2)
        )
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class Classify(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def _images(batch: int, size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=gen), torch.randint(0, 10, (batch,), generator=gen)


def resnet() -> Case:
    torch.manual_seed(0)
    return Case(Classify(ResNet()), _images(4, 16, 6), dropout=False, batchnorm=True)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, drop: float):
        super().__init__()
        self.heads, self.drop = heads, drop
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(drop)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop if self.training else 0.0)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, drop: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, drop)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(drop), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch embedding (strided conv), class token, learned positions, pre-norm blocks, head on the class token."""

    def __init__(
        self,
        size: int = 16,
        patch: int = 4,
        dim: int = 32,
        depth: int = 2,
        heads: int = 4,
        drop: float = 0.1,
        classes: int = 10,
    ):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock(dim, heads, drop) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def vit() -> Case:
    torch.manual_seed(0)
    return Case(Classify(ViT()), _images(4, 16, 7), dropout=True, batchnorm=False)


class MoE(nn.Module):
    """Mixture of experts with top-k routing: a softmax router picks k experts per token and their renormalised
    weights are scattered into a dense (tokens, experts) gate, zero for the experts not picked; each expert's output
    is scaled by its gate. A load-balancing term makes the router's gradient depend on every expert's share.

    Experts run on every token (static shapes, no data-dependent control flow). Gathering expert weights by index
    instead (`w1[index]` then a batched matmul) is not bitwise reproducible under torch's own aot_eager: its
    batched-matmul backward sums in another order than eager's.
    """

    def __init__(self, dim: int = 32, hidden: int = 64, experts: int = 4, k: int = 2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, dim)) for _ in range(experts)
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        tokens = self.norm(x).reshape(-1, x.shape[-1])  # (T, D)
        probs = self.router(tokens).softmax(dim=-1)  # (T, E)
        weight, index = probs.topk(self.k, dim=-1)  # (T, k)
        gate = torch.zeros_like(probs).scatter(-1, index, weight / weight.sum(dim=-1, keepdim=True))
        y = sum(gate[:, e : e + 1] * expert(tokens) for e, expert in enumerate(self.experts))
        balance = probs.mean(dim=0).square().sum() * probs.shape[-1]
        return x + y.reshape(x.shape), balance


class MoEModel(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 32):
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(MoE(dim) for _ in range(layers))

    def forward(self, x, target):
        x = self.embed(x)
        aux = x.new_zeros(())
        for layer in self.layers:
            x, balance = layer(x)
            aux = aux + balance
        return F.mse_loss(x, target) + 0.01 * aux


def moe() -> Case:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(8)
    x, target = torch.randn(2, 16, 32, generator=gen), torch.randn(2, 16, 32, generator=gen)
    return Case(MoEModel(), (x, target), dropout=False, batchnorm=False)


class InplaceConvNet(nn.Module):
    """Conv → BN → ReLU(inplace) twice, then a conv output scaled by `mul_` and rectified by `relu_` in place,
    a residual add, dropout, max-pool, linear."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 16, 3, padding=1, stride=2),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
        )
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        y = self.features(x)
        z = self.conv(y)
        z.mul_(0.5)  # conv's backward does not read its output, so it may be scaled in place
        z.relu_()
        z = self.drop(z + y)
        return self.head(z.amax(dim=(2, 3)))


def convnet() -> Case:
    torch.manual_seed(0)
    return Case(Classify(InplaceConvNet()), _images(4, 16, 9), dropout=True, batchnorm=True)


BUILDERS: dict[str, Callable[[], Case]] = {
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
    "t5": t5,
    "resnet": resnet,
    "vit": vit,
    "moe": moe,
    "convnet": convnet,
}
