"""Module-level functions for the tests of what AOTAutograd's runtime wrappers do around a compiled
graph (tests/capturing/test_runtime_wrappers.py): importable, as DynamoTracer requires."""
from __future__ import annotations

import torch


def adds_in_place(x):
    x.add_(1)
    return x * 2


def unsqueezes_in_place(x):
    x.unsqueeze_(0)
    return x * 2


def writes_one_reads_both(a, b):
    a.add_(1)
    return a + b


def linear_without_grad(model, x):
    with torch.no_grad():
        return model(x)


def linear_partly_without_grad(model, x):
    with torch.no_grad():
        y = model(x)
    return y * x + model(x)


def turns_grad_off(x):
    torch._C._set_grad_enabled(False)
    return x * 2


def cube_sin(x):
    return (x**3).sin()


def linear_partly_in_inference_mode(model, x):
    with torch.inference_mode():
        y = model(x)
    return y.clone() * x + model(x)


def grad_on_inside(x):
    with torch.enable_grad():
        y = x * x
    return y, x * 3


def gathers_under_no_grad(x, index):
    with torch.no_grad():
        y = x[index] * 2
    return y + x.sum()


def gathers_in_nested_inference_mode(x, index):
    with torch.no_grad():
        with torch.inference_mode():
            y = torch.index_select(x, 0, index) * 2
        z = x * 3
    return y.clone() + z.sum() + x.sum()
