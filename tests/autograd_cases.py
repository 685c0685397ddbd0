"""A forward that autograd records in eager (parameters and an input requiring grad), for the served
forward's autograd tests: fn and its model rebuild identically in any process from a seed."""
from __future__ import annotations

import torch
from torch import nn


def block(model, x):
    return model(x).tanh() * 2


def build(seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))
        return model, torch.randn(4, 6)


def grads(model: nn.Module, x: torch.Tensor, out: torch.Tensor) -> dict[str, list]:
    """What backward through `out` gives the model's parameters and x, as lists (None where none)."""
    out.pow(2).sum().backward()
    found = {name: None if p.grad is None else p.grad.tolist() for name, p in model.named_parameters()}
    found["x"] = None if x.grad is None else x.grad.tolist()
    return found


class RoundThrough(torch.autograd.Function):
    """A straight-through estimator: rounds forward, passes the gradient back as it is."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad):
        return grad


def frozen_first_layer(model, x):
    with torch.no_grad():
        h = model[0](x)
    return model[3](model[2](model[1](h)))


def straight_through(model, x):
    return RoundThrough.apply(model(x))


def grad_inside(model, x):
    with torch.enable_grad():
        return model(x) * 2


def branches_on_requires_grad(model, x):
    return model(x) * (3.0 if model[0].weight.requires_grad else 1.0)


class Checkpointed(nn.Sequential):
    """What transformers' layers do: ask grad mode only where gradient checkpointing is on."""

    gradient_checkpointing = False

    def forward(self, x):
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)
        return super().forward(x)


def checkpointed(model, x):
    return Checkpointed(*model)(x)
