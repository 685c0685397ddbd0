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
