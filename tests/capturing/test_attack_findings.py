"""Calls where a served capture differed from eager around what AOTAutograd's runtime wrappers and
fn's grad-mode switches do (found by attacking tests/capturing/test_runtime_wrappers.py's changes)."""
from __future__ import annotations

import torch

import attack_cases as cases
import precompile


def _served(tmp_path, fn, args, *, tracer="makefx", backend="inductor", mode=torch.no_grad):
    artifact, cache = tmp_path / f"{fn.__name__}.py", tmp_path / f"{fn.__name__}.cache"
    chosen = precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer()
    with mode(), precompile.capture(fn, artifact_path=artifact, cache_path=cache, tracer=chosen, backend=backend) as cap:
        cap(*args)
    return precompile.load(artifact_path=artifact, cache_path=cache)


def test_a_dynamo_training_graph_called_under_no_grad_that_turns_grad_on_records_autograd(tmp_path):
    """fn's `with torch.enable_grad():` under the caller's no_grad makes AOTAutograd compile a training
    pair, which its RuntimeWrapper runs with grad on; served under no_grad, the autograd.Function
    recorded nothing: y carried no autograd and x.grad stayed None."""
    served = _served(tmp_path, cases.grad_on_inside, (torch.ones(3, requires_grad=True),), tracer="dynamo")
    for fn in (cases.grad_on_inside, served):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with torch.no_grad():
            y, z = fn(x)
        assert y.requires_grad and not z.requires_grad
        assert torch.equal(y.detach(), x.detach() ** 2) and torch.equal(z, x.detach() * 3)
        y.sum().backward()
        assert torch.equal(x.grad, 2 * x.detach())
