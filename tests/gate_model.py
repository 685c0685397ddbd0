"""The model two releases of which the release-gate tests capture: one thing changed at a time."""
from __future__ import annotations

import torch


class Scaled(torch.nn.Module):
    def __init__(self, hidden: int = 32, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.fc = torch.nn.Linear(8, hidden, dtype=dtype)
        self.register_buffer("shift", torch.zeros(hidden, dtype=dtype))
        self.scale = 1.0

    def forward(self, x):
        return self.fc(x) * self.scale + self.shift


def step(model, x):
    return model(x)



def _relu(self, x):
    return torch.relu(self.fc(x)) * self.scale + self.shift


def _silu(self, x):
    return torch.nn.functional.silu(self.fc(x)) * self.scale + self.shift


def _eps5(self, x):
    return self.fc(x) * self.scale + self.shift + 1e-5


def _eps6(self, x):
    return self.fc(x) * self.scale + self.shift + 1e-6


def activated(kind: str) -> type[Scaled]:
    """A release of Scaled whose forward changed in one thing of the captured graph (issue 51, item 5):
    its activation (`relu`, `silu`) or an epsilon literal (`eps5`, `eps6`). Each is the class
    `gate_model.Activated` (bound here, as a release's module binds it), so only its graph differs."""
    forward = {"relu": _relu, "silu": _silu, "eps5": _eps5, "eps6": _eps6}[kind]
    cls = type("Activated", (Scaled,), {"forward": forward, "__module__": __name__, "__qualname__": "Activated"})
    globals()["Activated"] = cls
    return cls


class PrintingScaled(Scaled):
    """Scaled whose forward graph-breaks on a print, as debugging code does: captured inside Outer, its
    frame is served installed (issue 51, item 4)."""

    def forward(self, x):
        y = self.fc(x)
        print("scaled", tuple(y.shape))
        return y * self.scale + self.shift


class Outer(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + 1
