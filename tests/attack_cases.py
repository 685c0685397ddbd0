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
