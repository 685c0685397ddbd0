"""Boundary effects upstream's torch.compiler.precompile documents for its MakeFx capture (Note [precompile
programming model], invariant 4), served by ours in a fresh process: an input mutated in place is
mutated in the caller's tensor, and random ops draw from the caller's generator state, as eager does."""
from __future__ import annotations

import torch
from conftest import fresh_json

import precompile


def bump_and_double(x):
    x.add_(1)
    return x * 2


def add_noise(x):
    return x + torch.rand(3)


SERVE = r"""
import json, sys, torch, precompile
mutate = precompile.load(sys.argv[1] + "/mutate.py", sys.argv[1] + "/mutate.cache")
noise = precompile.load(sys.argv[1] + "/noise.py", sys.argv[1] + "/noise.cache")
x = torch.zeros(3)
y = mutate(x)
torch.manual_seed(7)
served = noise(torch.zeros(3))
again = noise(torch.zeros(3))
torch.manual_seed(7)
eager = torch.zeros(3) + torch.rand(3)  # add_noise, in eager
print(json.dumps({"x": x.tolist(), "y": y.tolist(), "same_draw": torch.equal(served, eager),
                  "next_draw_differs": not torch.equal(served, again)}))
"""


def test_input_mutation_and_rng_serve_as_eager_in_a_fresh_process(tmp_path):
    for name, fn in (("mutate", bump_and_double), ("noise", add_noise)):
        with precompile.capture(fn, artifact_path=tmp_path / f"{name}.py", cache_path=tmp_path / f"{name}.cache",
                                tracer=precompile.MakeFxTracer(), backend="eager") as cap:
            x = torch.zeros(3)
            cap(x)
        if name == "mutate":
            assert x.tolist() == [1.0, 1.0, 1.0]  # the capture call mutated once, not once more for the trace
    report = fresh_json(SERVE, str(tmp_path))
    assert report["x"] == [1.0, 1.0, 1.0] and report["y"] == [2.0, 2.0, 2.0]
    assert report["same_draw"] and report["next_draw_differs"]
