"""State a model builds on its first call (issue 55 item 4): a model run before the capture is refused,
naming that state and the remedy; one captured fresh, with two calls, serves a fresh model."""
from __future__ import annotations

import pytest
import torch

import dynamo_cases
import precompile
from conftest import fresh_json


def _capture(tmp_path, model, calls, **tracer):
    with torch.no_grad(), precompile.capture(
        dynamo_cases.call, artifact_path=tmp_path / "a.py", cache_path=tmp_path / "a.cache", backend="eager",
        tracer=precompile.DynamoTracer(**tracer),
    ) as cap:
        for _ in range(calls):
            cap(model, torch.ones(2, 4))


def test_a_model_run_before_the_capture_is_refused_naming_the_state_its_call_built(tmp_path):
    model = dynamo_cases.builds_on_first_call()
    model(torch.ones(2, 4))  # the reference run
    with pytest.raises(precompile.CaptureRefused) as refused:
        _capture(tmp_path, model, 2)
    message = str(refused.value)
    assert "model.ready (= True, assigned in forward in dynamo_cases)" in message
    assert "model.scale (= 2.0" in message
    assert "Capture from a model that has not been called" in message and "require_complete=False" in message
    assert not (tmp_path / "a.py").exists()


def test_require_complete_false_writes_it_anyway(tmp_path):
    model = dynamo_cases.builds_on_first_call()
    model(torch.ones(2, 4))
    _capture(tmp_path, model, 1, require_complete=False)
    assert (tmp_path / "a.py").exists()


SERVE = r"""
import json, sys, torch, precompile, dynamo_cases
served = precompile.load(sys.argv[1] + "/a.py", sys.argv[1] + "/a.cache")
model, x = dynamo_cases.builds_on_first_call(), torch.ones(2, 4)
with torch.no_grad(), precompile.no_compilation():
    first, second = served(model, x), served(model, x)
expected = dynamo_cases.builds_on_first_call()(x)
print(json.dumps([torch.equal(first, expected), torch.equal(second, expected), model.ready]))
"""


def test_a_fresh_model_captured_with_two_calls_serves_a_fresh_model_and_its_later_calls(tmp_path):
    _capture(tmp_path, dynamo_cases.builds_on_first_call(), 2)
    assert fresh_json(SERVE, str(tmp_path)) == [True, True, True]


RWKV = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=37,
            context_length=64, rescale_every=1)


def test_rwkv_run_before_the_capture_is_refused_naming_layers_are_rescaled(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.RwkvConfig(**RWKV)
    model = transformers.RwkvModel(config).eval()
    ids = torch.arange(14).reshape(2, 7)
    with torch.no_grad():
        model(ids)
    with pytest.raises(precompile.CaptureRefused, match=r"model\.layers_are_rescaled \(= True, assigned in .*_rescale_layers\)"):
        _capture_ids(tmp_path, model, ids)


def _capture_ids(tmp_path, model, ids):
    with torch.no_grad(), precompile.capture(dynamo_cases.call, artifact_path=tmp_path / "r.py",
                                             cache_path=tmp_path / "r.cache", backend="eager") as cap:
        cap(model, ids)
