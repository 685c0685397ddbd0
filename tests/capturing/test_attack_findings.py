"""Calls where a served capture differed from eager around what AOTAutograd's runtime wrappers and
fn's grad-mode switches do (found by attacking tests/capturing/test_runtime_wrappers.py's changes)."""
from __future__ import annotations

import pytest
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


def test_an_inference_tensor_the_compiled_graph_writes_into_is_refused_outside_inference_mode(tmp_path):
    """Eager's in-place op refuses an inference tensor outside inference_mode; the compiled module's
    kernel wrote into it through its data pointer and served the call. (DynamoTracer: its guard on the
    tensor's dispatch keys refuses such a call.)"""
    with torch.inference_mode():
        captured = torch.ones(3)
    served = _served(tmp_path, cases.adds_in_place, (captured,), mode=torch.inference_mode)
    with torch.inference_mode():
        x = torch.ones(3)
        assert torch.equal(served(x), torch.full((3,), 4.0)) and torch.equal(x, torch.full((3,), 2.0))
    for fn in (cases.adds_in_place, served):  # (eager's add_ raises after writing; served raises before)
        with torch.no_grad(), pytest.raises(RuntimeError, match="(?s)Inplace update to inference tensor outside InferenceMode"):
            fn(x)


@pytest.mark.parametrize("fn", [cases.gathers_under_no_grad, cases.gathers_in_nested_inference_mode], ids=lambda fn: fn.__name__)
def test_a_dynamo_eager_graph_that_raises_inside_fns_grad_mode_block_restores_the_mode(tmp_path, fn):
    """Eager's `with torch.no_grad():` / `inference_mode()` restore the mode on the way out of an op
    that raises; the served ATen graph holds them as calls, so the call left grad off (and, while the
    exception was kept, inference mode on: every tensor made after was an inference tensor)."""
    served = _served(tmp_path, fn, (torch.ones(3, requires_grad=True), torch.tensor([0, 1])), tracer="dynamo",
                     backend="eager", mode=torch.enable_grad)
    rendered = (tmp_path / f"{fn.__name__}.py").read_text()
    assert "_graph_0_ops" in rendered
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with torch.enable_grad():
        assert torch.equal(served(x, torch.tensor([0, 1])).detach(), fn(x, torch.tensor([0, 1])).detach())
        for call in (fn, served):
            kept = None
            try:
                call(x, torch.tensor([0, 7]))
            except IndexError as exc:
                kept = exc
            assert kept is not None
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            assert not torch.ones(1).is_inference()
            del kept


def test_a_written_input_interleaved_with_another_without_sharing_an_element_is_served_like_eager(tmp_path):
    """x[::2] and x[1::2] (RoPE's even and odd halves), or two columns of one matrix, span the same bytes
    but share no element: eager's write into one leaves the other as the module reads it. The overlap
    check compared spans only and refused them; it still refuses views that share an element."""
    served = _served(tmp_path, cases.writes_one_reads_both, (torch.zeros(8)[::2], torch.zeros(8)[1::2]))
    with torch.no_grad():
        for fn in (cases.writes_one_reads_both, served):
            base = torch.arange(8.0)
            assert torch.equal(fn(base[::2], base[1::2]), torch.tensor([2.0, 6.0, 10.0, 14.0]))
            assert torch.equal(base, torch.tensor([1.0, 1.0, 3.0, 3.0, 5.0, 5.0, 7.0, 7.0]))
        base = torch.arange(10.0)
        with pytest.raises(precompile.CallMismatch, match="share memory"):
            served(base[:8:2], base[2::2])  # elements 2, 4 and 6 in both
        matrix = torch.zeros(4, 2)
        assert torch.equal(served(matrix[:, 0], matrix[:, 1]), torch.ones(4)) and torch.equal(matrix[:, 0], torch.ones(4))
