"""A MakeFx forward serves in the grad mode of each call: captured with grad on, it serves under
no_grad and inference_mode (its values do not depend on grad mode), and a call autograd records
(grad mode on, a parameter or input requiring grad) returns results that carry autograd as eager's
do, whichever backend compiled it; each in a fresh process that never captured."""
from __future__ import annotations

import warnings

import autograd_cases
import pytest
import torch
from conftest import fresh_json

import precompile

SERVE = r"""
import json, sys, warnings, torch, precompile, autograd_cases
served = precompile.load(sys.argv[1], sys.argv[2])
report = {}
with precompile.no_compilation():
    model, x = autograd_cases.build()
    eager = autograd_cases.block(model, x)
    for name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with mode():
            out = served(model, x)
        report[name] = [torch.allclose(out, eager.detach(), atol=1e-5), out.requires_grad]
    x.requires_grad_(True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = served(model, x)
        served(model, x)
    report["warnings"] = [str(w.message) for w in said]
    report["grad"] = [torch.allclose(out, eager, atol=1e-5), out.requires_grad, out.grad_fn is not None]
    report["served_grads"] = autograd_cases.grads(model, x, out)
    model, x = autograd_cases.build()
    x.requires_grad_(True)
    report["eager_grads"] = autograd_cases.grads(model, x, autograd_cases.block(model, x))
print(json.dumps(report))
"""


def _capture(directory, backend, grad=True, mark=False, strict=True):
    model, x = autograd_cases.build()
    if mark:
        torch._dynamo.decorators.mark_unbacked(x, 0)
    paths = directory / f"block-{backend}.py", directory / f"block-{backend}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(
            autograd_cases.block, artifact_path=paths[0], cache_path=paths[1], tracer=precompile.MakeFxTracer(),
            backend=backend) as cap:
        with warnings.catch_warnings():
            if strict:  # the capture's own call says nothing of eager speed
                warnings.simplefilter("error", precompile.PrecompileWarning)
            cap(model, x)
    return paths


def _close(served: dict, eager: dict) -> bool:
    return served.keys() == eager.keys() and all(
        (a is None) == (b is None) and (a is None or torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5))
        for a, b in ((served[k], eager[k]) for k in eager))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_forward_captured_with_grad_on_serves_every_grad_mode_like_eager(tmp_path, backend):
    artifact, cache = _capture(tmp_path, backend)
    text = artifact.read_text(encoding="utf-8")
    assert "'grad_mode'" not in text  # a forward's values do not depend on it: not checked
    report = fresh_json(SERVE, str(artifact), str(cache))
    assert report["no_grad"] == [True, False] and report["inference_mode"] == [True, False]
    assert report["grad"] == [True, True, True]
    assert _close(report["served_grads"], report["eager_grads"])
    assert all(report["served_grads"][name] is not None for name in report["eager_grads"])
    if backend == "eager":
        assert report["warnings"] == []  # its graph is the ATen graph autograd records
    else:
        assert "autograd-graph" in text
        assert len(report["warnings"]) == 1 and "at eager speed" in report["warnings"][0], report["warnings"]
        assert "torch.inference_mode()" in report["warnings"][0]


def test_requires_grad_turned_on_after_a_no_grad_capture_records_autograd(tmp_path):
    model, x = autograd_cases.build()
    model.requires_grad_(False)
    artifact, cache = tmp_path / "frozen.py", tmp_path / "frozen.cache"
    with torch.no_grad(), precompile.capture(autograd_cases.block, artifact_path=artifact, cache_path=cache,
                                             tracer=precompile.MakeFxTracer(), backend="eager") as cap:
        cap(model, x)
    report = fresh_json(SERVE, str(artifact), str(cache))
    assert report["grad"] == [True, True, True]
    assert _close(report["served_grads"], report["eager_grads"])


def test_a_training_step_keeps_its_grad_mode_check(captured):
    """A graph that computes gradients itself serves only in the grad mode it was captured in."""
    assert "'grad_mode'" in captured["train_step"][0].read_text(encoding="utf-8")


def test_a_compiled_forward_with_unbacked_dims_refuses_autograd_at_capture_and_serve(tmp_path):
    """Its dims leave no ATen graph to record autograd: the capture's own call says its result carries
    none; served, it serves every size there under no_grad and refuses, naming the remedy, a call
    autograd would record."""
    with pytest.warns(precompile.PrecompileWarning, match=r"capture's result carries no autograd.*mark_unbacked"):
        _capture(tmp_path, "inductor", mark=True, strict=False)
    artifact, cache = _capture(tmp_path, "inductor", grad=False, mark=True)
    served = precompile.load(artifact, cache)
    model, x = autograd_cases.build()
    with torch.no_grad():
        assert torch.allclose(served(model, x[:3]), autograd_cases.block(model, x[:3]), atol=1e-5)
    with pytest.raises(precompile.CallMismatch, match=r"would record autograd.*mark_unbacked.*torch\.inference_mode\(\)"):
        served(model, x)


def _eager_capture(tmp_path, fn, grad=True, shaped=False):
    """`shaped`: fn's code shapes autograd, so the capture's own call warns its result carries none."""
    model, x = autograd_cases.build()
    paths = tmp_path / f"{fn.__name__}.py", tmp_path / f"{fn.__name__}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(fn, artifact_path=paths[0], cache_path=paths[1],
                                                          tracer=precompile.MakeFxTracer(), backend="eager") as cap:
        if shaped:
            with pytest.warns(precompile.PrecompileWarning, match="capture's result carries no autograd"):
                assert not cap(model, x).requires_grad
        else:
            cap(model, x)
    return precompile.load(*paths)


@pytest.mark.parametrize(("fn", "named"), [
    (autograd_cases.frozen_first_layer, r"runs \w+ where autograd records nothing \(torch\.no_grad"),
    (autograd_cases.straight_through, r"where autograd records nothing .*autograd\.Function's forward"),
])
def test_a_forward_whose_code_shapes_autograd_refuses_calls_autograd_records(tmp_path, fn, named):
    """fn's own no_grad region over a parameter, or an autograd.Function whose backward the graph never
    holds: values serve in every grad mode, a call autograd records is refused, naming why."""
    served = _eager_capture(tmp_path, fn, shaped=True)
    model, x = autograd_cases.build()
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            assert torch.allclose(served(model, x), fn(model, x))
    with pytest.raises(precompile.CallMismatch, match=named + r".*capture with DynamoTracer"):
        served(model, x)


def test_grad_turned_on_inside_fn_refuses_any_call_with_a_tensor_requiring_grad(tmp_path):
    served = _eager_capture(tmp_path, autograd_cases.grad_inside, grad=False)
    model, x = autograd_cases.build()
    with torch.no_grad(), pytest.raises(precompile.CallMismatch, match=r"turns grad mode on inside"):
        served(model, x)  # eager's result carries autograd here: served's could not
    with torch.inference_mode():
        assert torch.allclose(served(model, x), autograd_cases.grad_inside(model, x))
    model.requires_grad_(False)
    with torch.no_grad():
        assert torch.allclose(served(model, x), autograd_cases.grad_inside(model, x))


def test_a_branch_on_requires_grad_is_checked(tmp_path):
    served = _eager_capture(tmp_path, autograd_cases.branches_on_requires_grad)
    model, x = autograd_cases.build()
    with torch.no_grad():
        assert torch.allclose(served(model, x), autograd_cases.branches_on_requires_grad(model, x))
        model[0].weight.requires_grad_(False)
        with pytest.raises(precompile.CallMismatch, match=r"requires_grad are \(False, True, .*captured with \(True, True"):
            served(model, x)


def test_code_that_names_grad_mode_without_asking_serves_in_every_grad_mode(tmp_path):
    """transformers' `self.gradient_checkpointing and torch.is_grad_enabled()` short-circuits: the trace
    never asked, so grad mode is not checked; code that asks still has it checked."""
    served = _eager_capture(tmp_path, autograd_cases.checkpointed)
    model, x = autograd_cases.build()
    with torch.inference_mode():
        assert torch.allclose(served(model, x), autograd_cases.checkpointed(model, x))
    text = (tmp_path / "checkpointed.py").read_text(encoding="utf-8")
    assert "'grad_mode'" not in text
