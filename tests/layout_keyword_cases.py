"""Models and functions for tests/roundtrip/test_layouts_and_keywords.py, in an importable module as
DynamoTracer requires; `models()` builds the same weights in every process."""
from __future__ import annotations

import torch
from torch import nn


def models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), nn.Linear(5, 3)


def run(model, x):
    return model(x)


def partly_kept(model, x, y, z):
    """Under Inductor, x may be passed in any layout (copied into the captured one); y, written in place,
    and z, returned as a view, only in the captured one."""
    y.add_(1)
    return model(x) + y.sum(), z.t()


def by_keyword(x, *, model, scale=1.0):
    return model(x) * scale


class Doubled(nn.Linear):
    """A Linear of another class: the same parameters, another forward."""

    def forward(self, x):
        return super().forward(x) * 2


def scaled(model, x, *, scale=1.0, bias=None, mode="add"):
    y = model(x) * scale
    if bias is not None:
        y = y + bias if mode == "add" else y - bias
    return y


def layouts() -> dict[str, tuple[int, torch.Tensor]]:
    """Served inputs by name: (0 for the conv model, 1 for the linear one, the input)."""
    torch.manual_seed(1)
    image, wide = torch.randn(2, 3, 8, 8), torch.randn(4, 9)
    return {
        "conv contiguous": (0, image),
        "conv channels_last": (0, image.to(memory_format=torch.channels_last)),
        "conv permuted to channels_last": (0, torch.randn(2, 8, 8, 3).permute(0, 3, 1, 2)),
        "conv offset view x[1:]": (0, torch.randn(3, 3, 8, 8)[1:]),
        "linear offset view x[1:]": (1, torch.randn(5, 5)[1:]),
        "linear column slice big[:, 2:7]": (1, wide[:, 2:7]),
        "linear transposed": (1, torch.randn(5, 4).t()),
    }
