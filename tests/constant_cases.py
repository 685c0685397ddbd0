"""Functions that build small tensor constants inside fn (importable, as DynamoTracer requires)."""
from __future__ import annotations

import torch

BIG = torch.arange(100.0)


def scales(x):
    return x * torch.tensor([1.0, 2.0])


def appends_nothing(x):
    # what transformers' cache does inside forward: torch.tensor([]) joined to real data
    return torch.cat([x, torch.tensor([], dtype=x.dtype)]) * 2


def mixes_a_table(x):
    # 2-D, ints and floats, specials: a table Inductor keeps as a constant (it inlines only short 1-D ones)
    table = torch.tensor([[0.5, -0.0, float("inf"), 3.0]] * 4) + torch.tensor([[1], [2], [3], [4]])
    return torch.nan_to_num(x @ table, posinf=7.0)


def adds_a_big_constant(x):
    return x + torch.tensor([float(i) for i in range(100)])


def reads_a_big_global(x):
    return x + BIG


SMALL = {"scales": (scales, 2), "appends_nothing": (appends_nothing, 3), "mixes_a_table": (mixes_a_table, 4)}


def grows_an_empty_cache(x):
    # transformers' KV cache: keys joined onto torch.tensor([]), then viewed; eager's cat returns a
    # contiguous tensor, Inductor's decomposition a clone of the one non-empty input (its strides)
    keys = torch.cat([torch.tensor([]), x.transpose(0, 1)])
    table = torch.tensor([[0.5, -0.0, float("inf"), 3.0]] * 4) + torch.tensor([[1], [2], [3], [4]])
    return torch.nan_to_num(keys.view(6, 4) @ table, nan=0.0, posinf=7.0, neginf=-7.0)
