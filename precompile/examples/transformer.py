"""A small two-layer transformer written in plain torch: the model `precompile demo` captures."""
from __future__ import annotations

import math

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm self-attention + MLP, with the attention written out in matmuls."""

    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, length, width)
        x = x + self.proj(attended)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The computation the demo captures: one forward pass."""
    return model(x)


def make_demo(seed: int = 0) -> tuple[TinyTransformer, torch.Tensor]:
    """The demo model and input, the same in every process for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyTransformer().eval()
    return model, torch.randn(2, 16, 64, generator=generator)
