"""Module-level functions for tests/capturing/test_attack_findings.py: importable, as DynamoTracer
requires."""
from __future__ import annotations

import torch


def grad_on_inside(x):
    with torch.enable_grad():
        y = x * x
    return y, x * 3
