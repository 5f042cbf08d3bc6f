"""A small decoder-only transformer, and the synthetic token sequences it learns, for the parallel
layouts (training/layouts.py): token and position embeddings, blocks of causal self-attention and an
MLP, a final norm and an untied head (so a pipeline's stages share no parameter).

The layers live in a `ModuleDict` keyed by their index, and every part a pipeline stage may lack is
optional: a stage is the full model with the others deleted, so its parameters keep the full model's
names and a checkpoint moves between layouts by name. Under tensor parallelism the attention's
projections hold a slice of the heads: it infers its local head count from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TransformerSpec:
    vocab: int = 64
    width: int = 64
    heads: int = 4
    layers: int = 4
    seq_len: int = 16
    mlp_ratio: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"transformer: width {self.width} is not a multiple of heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


class Attention(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.head_dim, self.dropout = spec.head_dim, spec.dropout
        self.wq = nn.Linear(spec.width, spec.width, bias=False)
        self.wk = nn.Linear(spec.width, spec.width, bias=False)
        self.wv = nn.Linear(spec.width, spec.width, bias=False)
        self.wo = nn.Linear(spec.width, spec.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # (batch, heads, seq, head_dim); -1 heads: all of them, or this rank's slice under TP
        q, k, v = (
            w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.width, spec.width * spec.mlp_ratio)
        self.w2 = nn.Linear(spec.width * spec.mlp_ratio, spec.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm residual block: the unit FSDP shards and a pipeline stage holds whole."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(spec.width)
        self.attention = Attention(spec)
        self.ffn_norm = nn.LayerNorm(spec.width)
        self.feed_forward = FeedForward(spec)
        self.dropout = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x)))
        return x + self.dropout(self.feed_forward(self.ffn_norm(x)))


class Transformer(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab); a pipeline stage's middle takes and gives
    hidden states (batch, seq, width)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab, spec.width)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(spec.seq_len, spec.width)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(spec.width)
        self.output: nn.Linear | None = nn.Linear(spec.width, spec.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None and self.pos_embeddings is not None:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, seq): TP shards dim 1
            x = self.tok_embeddings(x) + self.pos_embeddings(positions)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each position's prediction of the next token (the last predicts nothing)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def synthetic_tokens(spec: TransformerSpec, count: int, seed: int) -> torch.Tensor:
    """`count` sequences from `seed` alone, with structure to learn: each token follows from the one
    before by a fixed rule (t -> 3t + 1 mod vocab), with one in eight replaced at random."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.empty(count, spec.seq_len, dtype=torch.long)
    tokens[:, 0] = torch.randint(spec.vocab, (count,), generator=generator)
    for position in range(1, spec.seq_len):
        tokens[:, position] = (3 * tokens[:, position - 1] + 1) % spec.vocab
    noise = torch.rand(count, spec.seq_len, generator=generator) < 0.125
    tokens[noise] = torch.randint(spec.vocab, (int(noise.sum()),), generator=generator)
    return tokens
