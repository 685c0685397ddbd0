"""Small tensor constants built inside fn are rendered into python_code as literals (both tracers,
both backends) and served in a fresh process with nothing compiled; real data is refused before any
lowering, saying what to change."""
from __future__ import annotations

import json

import constant_cases as cc
import pytest
import torch
from conftest import fresh_json

import precompile
from precompile import CaptureRefused

TRACERS = {"makefx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def _capture(directory, name, fn, x, tracer, backend="eager"):
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.no_grad(), precompile.capture(fn, artifact_path=artifact, cache_path=cache,
                                             tracer=TRACERS[tracer](), backend=backend) as cap:
        out = cap(x)
    assert torch.allclose(out, fn(x), atol=1e-5)
    return artifact, cache


SERVE = r"""
import json, sys, torch, precompile
import constant_cases as cc
pairs = json.loads(sys.argv[1])
results = {}
for name, (fn_name, size, artifact, cache) in pairs.items():
    served = precompile.load(artifact, cache)
    x = torch.randn(*size) if isinstance(size, list) else torch.randn(size)
    with torch.no_grad(), precompile.no_compilation():
        results[name] = torch.allclose(served(x), getattr(cc, fn_name)(x), atol=1e-5)
print(json.dumps({"results": results, "compilers": sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules)}))
"""


@pytest.mark.parametrize("tracer", TRACERS)
def test_small_and_zero_size_constants_are_served_fresh_under_no_compilation(tmp_path, tracer):
    pairs = {}
    for name, (fn, size) in cc.SMALL.items():
        artifact, cache = _capture(tmp_path, name, fn, torch.randn(size), tracer)
        pairs[name] = (fn.__name__, size, str(artifact), str(cache))
    source = (tmp_path / "scales.py").read_text()
    assert "torch.tensor([1.0, 2.0], dtype = torch.float32" in source
    assert "torch.empty([0], dtype = torch.float32" in (tmp_path / "appends_nothing.py").read_text()
    report = fresh_json(SERVE, json.dumps(pairs))
    assert report["results"] == {name: True for name in cc.SMALL}
    assert report["compilers"] == []


def test_a_capture_with_constants_renders_the_same_python_code_twice(tmp_path):
    """(MakeFx: a second Dynamo capture in one process mints other names, whatever its constants.)"""
    tracer = "makefx"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _capture(tmp_path / "a", "m", cc.mixes_a_table, torch.randn(4), tracer)
    second = _capture(tmp_path / "b", "m", cc.mixes_a_table, torch.randn(4), tracer)
    assert first[0].read_text() == second[0].read_text()


def test_inductor_renders_the_constants_its_output_module_keeps(tmp_path):
    """A 2-D table (Inductor keeps it as a module constant) and an empty cache joined then viewed."""
    artifact, cache = _capture(tmp_path, "cache", cc.grows_an_empty_cache, torch.randn(2, 3, 4), "makefx", backend="inductor")
    source = artifact.read_text()
    assert "= None  # device(" not in source  # no slot left for Inductor's loader to fill (nor its addresses)
    report = fresh_json(SERVE, json.dumps({"cache": ("grows_an_empty_cache", [2, 3, 4], str(artifact), str(cache))}))
    assert report == {"results": {"cache": True}, "compilers": []}


REFUSED = [
    ("makefx", "eager", cc.adds_a_big_constant, r"shape \(100,\).*100 elements.*over 64 elements.*baked into the artifact"),
    ("makefx", "inductor", cc.reads_a_big_global, r"global constant_cases\.BIG .*existed before the call.*Pass it as an argument"),
    ("dynamo", "eager", cc.adds_a_big_constant, r"100 elements.*over 64 elements.*Pass it as an argument"),
    ("dynamo", "inductor", cc.adds_a_big_constant, r"creates a tensor from data \(torch.tensor\).*100 elements"),
]


@pytest.mark.parametrize(("tracer", "backend", "fn", "message"), REFUSED, ids=[f"{t}-{b}-{f.__name__}" for t, b, f, _ in REFUSED])
def test_a_large_constant_is_refused_before_lowering(tmp_path, monkeypatch, tracer, backend, fn, message):
    from torch._inductor import compile_fx

    def lowering(*args, **kwargs):
        raise AssertionError("Inductor was asked to compile before the refusal")

    monkeypatch.setattr(compile_fx, "compile_fx", lowering)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", lowering)
    with pytest.raises(CaptureRefused, match=message):
        _capture(tmp_path, "big", fn, torch.randn(100), tracer, backend)
    assert not (tmp_path / "big.py").exists() and not (tmp_path / "big.cache").exists()


GLOBAL_LINEAR = torch.nn.Linear(2, 2)


def reads_a_global_module(x):
    return GLOBAL_LINEAR(x)


def test_the_parameters_of_a_module_that_is_not_an_argument_are_refused(tmp_path):
    with pytest.raises(CaptureRefused, match=r"reads parameter .* not a parameter of a module argument"):
        _capture(tmp_path, "param", reads_a_global_module, torch.randn(2), "makefx")
