"""What AOTAutograd's runtime wrappers and autograd.Function do around a compiled graph, which
python_code does not run (it calls the output module's call() itself): each test serves a capture
and compares it with eager. The wrappers (torch._functorch._aot_autograd.runtime_wrappers): the
RuntimeWrapper applies input mutations the graph returns (a metadata mutation: as_strided_), bumps
the version counter of the inputs the graph writes into, runs an inference graph with grad off and
sets the grad mode the graph left; AOTSyntheticBaseWrapper merges aliased inputs one of which is
written; the autograd.Function refuses a double backward. And what make_fx, tracing below autograd,
drops of a Dynamo graph the eager backend renders: its grad-mode switches."""
from __future__ import annotations

import pytest
import torch

import precompile
import wrapper_cases as cases


def _served(tmp_path, fn, args, *, tracer="makefx", backend="inductor", grad=False, mode=None):
    """fn captured on `args` under grad mode `grad` (or the context `mode()`), loaded back."""
    artifact, cache = tmp_path / f"{fn.__name__}.py", tmp_path / f"{fn.__name__}.cache"
    chosen = precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer()
    with mode() if mode else torch.set_grad_enabled(grad), precompile.capture(fn, artifact_path=artifact, cache_path=cache,
                                                          tracer=chosen, backend=backend) as cap:
        cap(*args)
    return precompile.load(artifact_path=artifact, cache_path=cache)


def _weight_grad_after(fn, grad):
    """w.grad of (w * x).sum() when fn(x) writes into x in between: eager's version counter makes the
    backward refuse (x changed since it was saved); without it the backward reads the new x."""
    w, x = torch.ones(3, requires_grad=True), torch.ones(3)
    y = (w * x).sum()
    with torch.set_grad_enabled(grad):
        fn(x)
    assert x._version > 0, "the write into x was not recorded in its version counter"
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_an_input_the_compiled_graph_writes_into_has_its_version_bumped(tmp_path, tracer):
    _weight_grad_after(cases.adds_in_place, grad=tracer == "dynamo")  # eager
    served = _served(tmp_path, cases.adds_in_place, (torch.ones(3),), tracer=tracer, grad=tracer == "dynamo")
    _weight_grad_after(served, grad=tracer == "dynamo")


def test_a_makefx_graph_that_changes_an_inputs_shape_in_place_is_refused_for_inductor(tmp_path):
    """AOTAutograd returns the input's new metadata as an extra first output and applies it with
    as_strided_; served without that wrapper, fn's result was that extra output (x, not x * 2)."""
    with pytest.raises(precompile.CaptureRefused, match=r"(?s)AOTAutograd.*backend='eager'"):
        _served(tmp_path, cases.unsqueezes_in_place, (torch.arange(4.0),))
    eager = _served(tmp_path, cases.unsqueezes_in_place, (torch.arange(4.0),), backend="eager")
    x = torch.arange(4.0)
    with torch.no_grad():
        assert torch.equal(eager(x), torch.arange(4.0).unsqueeze(0) * 2)
    assert x.shape == (1, 4)


def test_a_makefx_capture_on_aliased_inputs_one_written_is_refused_for_inductor(tmp_path):
    """AOTAutograd merges the two into one synthetic base input; the output module then takes other
    inputs than the graph (the capture's own call failed with a bare unpacking ValueError)."""
    x = torch.zeros(4)
    with pytest.raises(precompile.CaptureRefused, match=r"(?s)AOTAutograd.*backend='eager'"):
        _served(tmp_path, cases.writes_one_reads_both, (x, x))


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_inputs_captured_apart_and_served_aliased_are_refused_or_served_like_eager(tmp_path, backend):
    """Captured on distinct tensors, served f(x, x): the Inductor module is functional inside, so it
    would read b as it was before the write into a (1, where eager gives 2); it refuses instead, naming
    the remedy. The eager backend runs the in-place ATen ops as traced, so it serves eager's result;
    and either serves overlapping halves of one tensor that do not share an element like eager."""
    served = _served(tmp_path, cases.writes_one_reads_both, (torch.zeros(4), torch.zeros(4)), backend=backend)
    x = torch.zeros(4)
    with torch.no_grad():
        if backend == "inductor":
            with pytest.raises(precompile.CallMismatch, match=r"share memory.*\.clone\(\).*backend='eager'"):
                served(x, x)
            assert torch.equal(x, torch.zeros(4)), "the refused call wrote into its input"
        else:
            assert torch.equal(served(x, x), torch.full((4,), 2.0))
        whole = torch.zeros(8)
        assert torch.equal(served(whole[:4], whole[4:]), torch.ones(4))
        assert torch.equal(whole, torch.tensor([1.0] * 4 + [0.0] * 4))


def test_a_dynamo_inference_graph_runs_with_grad_off_though_an_input_requires_grad(tmp_path):
    """fn computes under no_grad from a parameter that requires grad: AOTAutograd compiles an inference
    graph and runs it with grad off; with grad on, its out= kernels refuse an input requiring grad."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(3, 3), torch.ones(2, 3)
    served = _served(tmp_path, cases.linear_without_grad, (model, x), tracer="dynamo", grad=True)
    out = served(model, x)
    assert torch.allclose(out, model(x)) and not out.requires_grad


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_a_dynamo_graph_that_turns_grad_off_leaves_it_off(tmp_path, backend):
    """AOTAutograd's graph keeps no grad-mode switch (its wrapper sets the mode after the call), make_fx's
    traced below autograd kept none either: served, both left grad on."""
    served = _served(tmp_path, cases.turns_grad_off, (torch.ones(3),), tracer="dynamo", backend=backend, grad=True)
    rendered = (tmp_path / "turns_grad_off.py").read_text()
    assert ("grad_mode=False" if backend == "inductor" else "torch._C._set_grad_enabled(False)") in rendered
    try:
        with torch.enable_grad():
            cases.turns_grad_off(torch.ones(3))
            assert not torch.is_grad_enabled()  # eager
        with torch.enable_grad():
            assert torch.equal(served(torch.ones(3)), torch.full((3,), 2.0))
            assert not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)


def test_a_double_backward_through_a_lowered_training_graph_is_refused(tmp_path):
    """torch.compile refuses it (AOTAutograd's CompiledFunctionBackward); served, the first gradient
    carried no graph and the second backward silently left out its term."""
    served = _served(tmp_path, cases.cube_sin, (torch.ones(3, requires_grad=True),), tracer="dynamo", grad=True)
    x = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
    (first,) = torch.autograd.grad(served(x).sum(), x, create_graph=True)
    assert torch.allclose(first, (3 * x**2 * (x**3).cos()).detach())
    with pytest.raises(RuntimeError, match="double backward"):
        (first.sum() + x.sum()).backward()


@pytest.mark.parametrize("fn", [cases.linear_partly_without_grad, cases.linear_partly_in_inference_mode], ids=lambda fn: fn.__name__)
def test_a_dynamo_eager_graph_keeps_fns_no_grad_and_inference_mode_blocks(tmp_path, fn):
    """make_fx traces a Dynamo graph below autograd: its grad-mode switches ran at trace time and left
    no node, so the served ops under fn's no_grad recorded autograd (the weight's gradient doubled)."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(3, 3), torch.ones(2, 3)
    served = _served(tmp_path, fn, (model, x), tracer="dynamo", backend="eager", grad=True)
    fn(model, x).sum().backward()
    eager_grad, model.weight.grad = model.weight.grad, None
    served(model, x).sum().backward()
    assert torch.equal(model.weight.grad, eager_grad)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


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
