"""Module-level functions for tests/capturing/test_attack_findings.py: importable, as DynamoTracer
requires."""
from __future__ import annotations

import torch


def grad_on_inside(x):
    with torch.enable_grad():
        y = x * x
    return y, x * 3


def adds_in_place(x):
    x.add_(1)
    return x * 2


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


def writes_one_reads_both(a, b):
    a.add_(1)
    return a + b
