"""diffusers' Flux transformer (the zoo's `flux`, a tiny config) under DynamoTracer, backend eager:
captured from two batch sizes here, served in a fresh process under no_compilation() at the first
shape and a third, compared with eager. Skipped where diffusers is not installed."""
from __future__ import annotations

import sys

import pytest
from conftest import ROOT, fresh_json

pytest.importorskip("diffusers")
sys.path.insert(0, str(ROOT))

CAPTURE = r"""
import sys, torch, precompile
from bench.zoo_models import ZOO
zoo = ZOO["flux"]
model, args = zoo.instantiate()
with torch.no_grad(), precompile.capture(zoo.step, artifact_path=sys.argv[1], cache_path=sys.argv[2],
                                         tracer=precompile.DynamoTracer(), backend="eager") as cap:
    cap(model, *args)
    cap(model, *zoo.other_shape(args, 1))
print("null")
"""

SERVE = r"""
import json, sys, torch, precompile
from bench.zoo_models import ZOO
zoo = ZOO["flux"]
served = precompile.load(sys.argv[1], sys.argv[2])
model, args = zoo.instantiate()
diffs = []
with torch.no_grad(), precompile.no_compilation():
    for shape in (args, zoo.other_shape(args, 2)):
        diffs.append((served(model, *shape) - zoo.step(model, *shape)).abs().max().item())
print(json.dumps(diffs))
"""


def test_flux_is_captured_by_dynamo_and_served_fresh_as_eager(tmp_path):
    """Flux reads diffusers' `_DTYPE_UNSUPPORTED_DEVICES.get(torch.float64)`, a dict keyed by dtype:
    its guard was refused as one python_code cannot check (issue 55 item 6)."""
    paths = (str(tmp_path / "flux.py"), str(tmp_path / "flux.cache"))
    fresh_json(CAPTURE, *paths)
    assert "_DTYPE_UNSUPPORTED_DEVICES[torch.float64]" in open(paths[0], encoding="utf-8").read()
    first, other = fresh_json(SERVE, *paths)
    assert first <= 1e-5 and other <= 1e-5, (first, other)
