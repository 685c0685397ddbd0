"""Representative captures, rebuilt identically in any process from a seed.

Each case is a module-level fn plus a builder of its arguments; the snapshot tests render them and
the round-trip tests serve them in a fresh process against eager.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn


def scale_and_shift(x, y):
    return {"sum": x * 2 + y, "parts": (x.sin(), y.cos()), "label": "ok"}


def mlp_forward(model, x):
    return model(x)


def encode_decode(encoder, decoder, x):
    return decoder(torch.relu(encoder(x))), encoder.weight.sum()


def train_step(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def _plain(generator):
    return (torch.randn(3, 5, generator=generator), torch.randn(3, 5, generator=generator))


def _mlp_args(generator):
    return (_mlp().eval(), torch.randn(6, 8, generator=generator))


def _tied_args(generator):
    encoder, decoder = nn.Linear(8, 8), nn.Linear(8, 8)
    decoder.weight = encoder.weight  # one Parameter shared across two module arguments
    return (encoder, decoder, torch.randn(5, 8, generator=generator))


def _train_args(generator):
    model = _mlp().train()
    model[3].bias.requires_grad_(False)  # a frozen parameter keeps .grad None
    return (model, torch.randn(6, 8, generator=generator))


@dataclass(frozen=True)
class Case:
    fn: Callable[..., Any]
    build: Callable[[torch.Generator], tuple]
    grad: bool = False

    def args(self, seed: int = 0) -> tuple:
        generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return self.build(generator)


CASES = {
    "plain_function": Case(scale_and_shift, _plain),
    "mlp_batchnorm": Case(mlp_forward, _mlp_args),
    "tied_two_modules": Case(encode_decode, _tied_args),
    "train_step": Case(train_step, _train_args, grad=True),
}
