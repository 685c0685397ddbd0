"""A model whose graph the trace recorded with views its kernels' layouts do not allow (transformers'
PatchTST built from a config) serves under both tracers, in a fresh process, as eager; the eager
backend turns such a view into a reshape unless something writes through it."""
from __future__ import annotations

import pytest
import torch
import trace_failure_cases as cases
from conftest import fresh_json
from torch.fx.experimental.proxy_tensor import make_fx

import precompile
from precompile.capturing.lowering import views_as_reshapes

SERVE = r"""
import json, sys, torch, precompile, trace_failure_cases as cases
served = precompile.load(sys.argv[1], sys.argv[2])
model, x = cases.patchtst()
with torch.no_grad(), precompile.no_compilation():
    print(json.dumps(torch.allclose(served(model, x), cases.forecast(model, x), atol=1e-6)))
"""


@pytest.mark.parametrize("tracer", [precompile.MakeFxTracer, precompile.DynamoTracer])
def test_patchtst_from_a_config_serves_under_both_tracers(tmp_path, tracer):
    model, x = cases.patchtst()
    paths = tmp_path / "p.py", tmp_path / "p.cache"
    with torch.no_grad(), precompile.capture(cases.forecast, artifact_path=paths[0], cache_path=paths[1],
                                             tracer=tracer(), backend="eager") as cap:
        assert torch.allclose(cap(model, x), cases.forecast(model, x), atol=1e-6)
    assert fresh_json(SERVE, *map(str, paths)) is True


def _written(buffer, x):
    flat = buffer.view(-1)
    flat.add_(x)
    return x.view(2, 3) * 2


def test_a_view_something_writes_through_stays_a_view():
    graph = make_fx(_written)(torch.zeros(6), torch.ones(6))
    views_as_reshapes(graph, keep_mutated=True)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten.view.default) == 1 and targets.count(torch.ops.aten.reshape.default) == 1
    buffer = torch.zeros(6)
    graph(buffer, torch.ones(6))
    assert torch.equal(buffer, torch.ones(6))  # the write reached its base
