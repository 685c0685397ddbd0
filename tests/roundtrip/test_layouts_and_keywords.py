"""Issue 55 item 5, served in a fresh process under no_compilation(): inputs of another memory layout
than the captured call's (channels_last, a transpose, a view with a storage offset or a wider row
stride) and keyword arguments, both tracers. Nothing served differs from eager; a refusal names the
remedy."""
from __future__ import annotations

import pytest
import torch
from conftest import fresh_json, run_fresh
from layout_keyword_cases import by_keyword, layouts, models, partly_kept, run, scaled
from test_inspect_helpers import run_cli

import precompile

SERVE_LAYOUTS = r"""
import json, sys, torch, precompile
from layout_keyword_cases import layouts, models, run
served = [precompile.load(sys.argv[1] + f"/{name}.py", sys.argv[1] + f"/{name}.cache") for name in ("conv", "linear")]
model = models()
report = {}
for case, (which, x) in layouts().items():
    try:
        with torch.no_grad(), precompile.no_compilation():
            y = served[which](model[which], x)
    except precompile.PrecompileError as exc:
        report[case] = "refused: " + str(exc)
        continue
    with torch.no_grad():
        torch.testing.assert_close(y, run(model[which], x), rtol=1e-5, atol=1e-5)
    report[case] = "served"
print(json.dumps(report))
"""

# What Dynamo's graphs are specialized on (strides) is served by a variant captured with it; a storage
# offset is not guarded, so an offset view of the captured layout serves from the contiguous variant.
DYNAMO_SERVES = {"conv contiguous", "conv channels_last", "conv permuted to channels_last", "conv offset view x[1:]",
                 "linear offset view x[1:]"}


@pytest.mark.parametrize(("tracer", "backend"), [("makefx", "eager"), ("makefx", "inductor"), ("dynamo", "eager"),
                                                  ("dynamo", "inductor")])
def test_other_layouts_serve_as_eager_or_are_refused_naming_the_remedy(tmp_path, tracer, backend):
    conv, linear = models()
    image = torch.randn(2, 3, 8, 8)
    # The conv model captured with both layouts it serves (DynamoTracer: two variants); the linear
    # model with the contiguous layout only.
    calls = {"conv": (conv, [image, image.to(memory_format=torch.channels_last)]), "linear": (linear, [torch.randn(4, 5)])}
    for name, (model, inputs) in calls.items():
        make = precompile.MakeFxTracer if tracer == "makefx" else precompile.DynamoTracer
        with torch.no_grad(), precompile.capture(run, artifact_path=tmp_path / f"{name}.py", cache_path=tmp_path / f"{name}.cache",
                                                 tracer=make(), backend=backend) as cap:
            for x in inputs[:1] if tracer == "makefx" else inputs:  # a MakeFx capture takes one call
                cap(model, x)
    report = fresh_json(SERVE_LAYOUTS, str(tmp_path))
    assert set(report) == set(layouts())
    # The eager backend's ATen graph is layout-flexible; Inductor's kernels take the captured layout,
    # into which the MakeFx driver copies an input passed in another.
    if tracer == "makefx":
        assert all(outcome == "served" for outcome in report.values()), report
        return
    for case, outcome in report.items():
        if case in DYNAMO_SERVES:
            assert outcome == "served", (case, outcome)
        else:
            assert "stride mismatch" in outcome and "capture a call with this layout too" in outcome, (case, outcome)
            assert "or pass contiguous tensors (.contiguous())" in outcome, outcome


SERVE_KEPT = r"""
import json, sys, torch, precompile
from layout_keyword_cases import models, partly_kept
f = precompile.load(sys.argv[1] + "/kept.py", sys.argv[1] + "/kept.cache")
model = models()[1]
report = {}
for case in ("captured layout", "x transposed", "y transposed", "z transposed"):
    inputs = [torch.randn(4, 5), torch.randn(3, 3), torch.randn(2, 3)]
    if case != "captured layout":
        which = "xyz".index(case[0])
        inputs[which] = inputs[which].t().contiguous().t()  # the same values, another layout
    ours, eager = [t.clone() for t in inputs], [t.clone() for t in inputs]  # clone keeps the layout
    try:
        with torch.no_grad(), precompile.no_compilation():
            y = f(model, *ours)
    except precompile.PrecompileError as exc:
        report[case] = "refused: " + str(exc)
        continue
    with torch.no_grad():
        torch.testing.assert_close(y, partly_kept(model, *eager))
    torch.testing.assert_close(ours[1], eager[1])  # the in-place write reached the caller's tensor
    assert y[1].data_ptr() == ours[2].data_ptr()  # and the view is of the caller's tensor, as eager's
    report[case] = "served"
print(json.dumps(report))
"""


def test_inductor_copies_an_input_of_another_layout_unless_fn_writes_or_returns_a_view_of_it(tmp_path, capsys):
    with torch.no_grad(), precompile.capture(partly_kept, artifact_path=tmp_path / "kept.py", cache_path=tmp_path / "kept.cache",
                                             tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
        cap(models()[1], torch.randn(4, 5), torch.randn(3, 3), torch.randn(2, 3))
    report = fresh_json(SERVE_KEPT, str(tmp_path))
    assert report["captured layout"] == report["x transposed"] == "served", report
    for case, got, why in (("y transposed", "(1, 3)", "fn writes into it in place"), ("z transposed", "(1, 2)", "fn returns a view of it")):
        assert (f"expected the captured memory layout (strides (3, 1) on dims [0, 1]), got strides {got} ({why}, so it "
                "is not copied into that layout); pass an input like the captured one, or capture again") in report[case], report[case]
    _, shown, _ = run_cli(capsys, ["show", str(tmp_path / "kept.py")])
    assert "args[2]  tensor (3, 3) torch.float32 cpu (served in the captured layout only: fn writes into it in place)" in shown
    assert "args[1]  tensor (4, 5) torch.float32 cpu\n" in shown


SERVE_KEYWORDS = r"""
import json, sys, torch, precompile
from layout_keyword_cases import models, scaled
f = precompile.load(sys.argv[1] + "/kw.py", sys.argv[1] + "/kw.cache")
model = models()[1]
x, bias = torch.randn(4, 5), torch.randn(3)
calls = {
    "as captured": dict(scale=2.0, bias=bias),
    "another order, new tensors": dict(bias=torch.randn(3), scale=2.0),
    "missing bias": dict(scale=2.0),
    "extra mode": dict(scale=2.0, bias=bias, mode="sub"),
    "another scale": dict(scale=3.0, bias=bias),
    "bias of another shape": dict(scale=2.0, bias=torch.randn(4, 3)),
    "scale passed positionally": None,
}
report = {}
for case, kwargs in calls.items():
    try:
        with precompile.no_compilation():
            y = f(model, x, 2.0, bias=bias) if kwargs is None else f(model, x, **kwargs)
    except (precompile.PrecompileError, TypeError) as exc:
        report[case] = "refused: " + str(exc)
        continue
    torch.testing.assert_close(y, scaled(model, x, **kwargs))
    report[case] = "served"
print(json.dumps(report))
"""


@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_keyword_arguments_are_captured_and_served_by_name(tmp_path, tracer):
    model = models()[1]
    x, bias = torch.randn(4, 5), torch.randn(3)
    make = precompile.MakeFxTracer if tracer == "makefx" else precompile.DynamoTracer
    with precompile.capture(scaled, artifact_path=tmp_path / "kw.py", cache_path=tmp_path / "kw.cache", tracer=make(),
                            backend="eager") as cap:
        torch.testing.assert_close(cap(model, x, scale=2.0, bias=bias), scaled(model, x, scale=2.0, bias=bias))
    report = fresh_json(SERVE_KEYWORDS, str(tmp_path))
    assert report["as captured"] == report["another order, new tensors"] == "served", report
    refused = {case: outcome for case, outcome in report.items() if case not in ("as captured", "another order, new tensors")}
    assert all(outcome.startswith("refused: ") for outcome in refused.values()), report
    if tracer == "dynamo":  # Dynamo's own guards name the argument
        for case, name in (("missing bias", "bias"), ("extra mode", "mode"), ("another scale", "scale"),
                           ("bias of another shape", "bias")):
            assert name in refused[case], (case, refused[case])
        return
    assert "kw.py: got keyword arguments ['scale'] but the artifact was captured with ['scale', 'bias'] (missing ['bias'], " \
           "unexpected [])" in refused["missing bias"]
    assert "(missing [], unexpected ['mode']); pass the captured call's keyword arguments, by name" in refused["extra mode"]
    assert "input kwargs['scale'] is 3.0 but the artifact was captured with 2.0" in refused["another scale"]
    assert "input kwargs['bias']: expected shape (3,), got (4, 3)" in refused["bias of another shape"]
    assert "(missing ['scale'], unexpected [])" in refused["scale passed positionally"]


SERVE_MODEL_KEYWORD = r"""
import json, sys, torch, precompile
from layout_keyword_cases import Doubled, by_keyword, models, run
f = precompile.load(sys.argv[1] + "/kw.py", sys.argv[1] + "/kw.cache")
g = precompile.load(sys.argv[1] + "/all.py", sys.argv[1] + "/all.cache")
model, x = models()[1], torch.randn(4, 5)
other = Doubled(5, 3)
other.load_state_dict(model.state_dict())
calls = {
    "as captured": lambda: f(x, model=model, scale=2.0),
    "all by keyword": lambda: g(model=model, x=x),
    "all by keyword, another order": lambda: g(x=x, model=model),
    "model of another class": lambda: f(x, model=other, scale=2.0),
    "model missing": lambda: f(x, scale=2.0),
    "not a model": lambda: f(x, model=x, scale=2.0),
    "model positionally": lambda: g(model, x=x),
}
report = {}
for case, call in calls.items():
    try:
        with torch.no_grad(), precompile.no_compilation():
            y = call()
    except precompile.PrecompileError as exc:
        report[case] = "refused: " + str(exc)
        continue
    with torch.no_grad():
        torch.testing.assert_close(y, run(model, x) * (2.0 if case == "as captured" else 1.0))
    report[case] = "served"
print(json.dumps(report))
"""


def test_a_model_passed_by_keyword_is_captured_and_served_by_name(tmp_path):
    """A model passed by keyword is lifted like a positional one: its parameters and buffers, its
    class and hooks checked, named kwargs['model']."""
    model, x = models()[1], torch.randn(4, 5)
    for name, fn, args, kwargs in (("kw", by_keyword, (x,), dict(model=model, scale=2.0)), ("all", run, (), dict(model=model, x=x))):
        with torch.no_grad(), precompile.capture(fn, artifact_path=tmp_path / f"{name}.py", cache_path=tmp_path / f"{name}.cache",
                                                 tracer=precompile.MakeFxTracer(), backend="eager") as cap:
            torch.testing.assert_close(cap(*args, **kwargs), fn(*args, **kwargs))
    assert "MODULE_KEYWORDS = ('model',)" in (tmp_path / "kw.py").read_text()
    report = fresh_json(SERVE_MODEL_KEYWORD, str(tmp_path))
    for case in ("as captured", "all by keyword", "all by keyword, another order"):
        assert report[case] == "served", (case, report[case])
    assert ("kwargs['model'].__class__ is class layout_keyword_cases.Doubled but the artifact was captured with class "
            "torch.nn.modules.linear.Linear") in report["model of another class"]
    assert "captured with ['model', 'scale'] (missing ['model'], unexpected [])" in report["model missing"]
    assert "keyword argument 'model' must be an nn.Module (the captured call passed one there), got Tensor; pass the model " \
           "by the same keyword" in report["not a model"]
    assert "captured with ['model', 'x'] (missing ['model'], unexpected [])" in report["model positionally"]


SERVE_EXPANDED = r"""
import sys, torch, precompile
from layout_keyword_cases import models
f = precompile.load(sys.argv[1] + "/expanded.py", sys.argv[1] + "/expanded.cache")
try:
    with torch.no_grad(), precompile.no_compilation():
        f(models()[1], torch.randn(4, 5), torch.randn(3, 3), torch.randn(2, 3))
    print("served")
except precompile.PrecompileError as exc:
    print("refused: " + str(exc))
"""


def test_inductor_refuses_a_dense_input_where_it_captured_an_expanded_one(tmp_path):
    """An expanded input's captured layout repeats elements: no copy holds another tensor's values in it,
    so a dense one is refused, naming why, never copied into a layout that would drop values."""
    with torch.no_grad(), precompile.capture(partly_kept, artifact_path=tmp_path / "expanded.py",
                                             cache_path=tmp_path / "expanded.cache", tracer=precompile.MakeFxTracer(),
                                             backend="inductor") as cap:
        cap(models()[1], torch.randn(1, 5).expand(4, 5), torch.randn(3, 3), torch.randn(2, 3))
    proc = run_fresh(SERVE_EXPANDED, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused: ") and "its captured layout repeats elements (an expand)" in proc.stdout, proc.stdout
