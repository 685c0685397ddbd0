"""A capture Dynamo compiles nothing of says why, in Dynamo's words; what Dynamo's own torch.compile
compiles, the artifact serves (issue 55 item 2: an nn.LSTM, under torch._dynamo.config.allow_rnn)."""
from __future__ import annotations

import pytest
import torch

import dynamo_cases
import precompile
from conftest import fresh_json


def _lstm():
    torch.manual_seed(0)
    return torch.nn.LSTM(8, 16, batch_first=True), torch.randn(2, 5, 8)


def test_a_capture_that_compiled_nothing_names_dynamos_reason_and_hint(tmp_path):
    lstm, x = _lstm()
    with pytest.raises(precompile.CaptureRefused) as refused:
        with torch.no_grad(), precompile.capture(dynamo_cases.rnn_step, artifact_path=tmp_path / "a.py",
                                                 cache_path=tmp_path / "a.cache", backend="eager") as cap:
            cap(lstm, x)
    message = str(refused.value)
    assert "0 backend graphs" in message
    assert "Dynamo does not support RNN, GRU, or LSTM" in message
    assert "torch._dynamo.config.allow_rnn=True" in message
    assert "It may be possible to write Dynamo tracing rules" not in message  # Dynamo's generic hint is left out
    assert not (tmp_path / "a.py").exists()


SERVE = r"""
import json, sys, torch, precompile, dynamo_cases
torch.manual_seed(0)
lstm, x = torch.nn.LSTM(8, 16, batch_first=True), torch.randn(2, 5, 8)
served = precompile.load(sys.argv[1] + "/lstm.py", sys.argv[1] + "/lstm.cache")
with torch.no_grad(), precompile.no_compilation():
    out = served(lstm, x)
    print(json.dumps({"equal": torch.equal(out, dynamo_cases.rnn_step(lstm, x))}))
"""


def test_an_lstm_captured_with_allow_rnn_serves_in_a_fresh_process(tmp_path):
    """Dynamo guards that the LSTM's flat weights (weak references, `_flat_weight_refs[0]()`) are its
    parameters; the artifact checks that through the weak references too."""
    lstm, x = _lstm()
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True), precompile.capture(
        dynamo_cases.rnn_step, artifact_path=tmp_path / "lstm.py", cache_path=tmp_path / "lstm.cache", backend="eager"
    ) as cap:
        cap(lstm, x)
    assert "is _by_name['weakref:ReferenceType'] else None)" in (tmp_path / "lstm.py").read_text()
    assert fresh_json(SERVE, str(tmp_path)) == {"equal": True}
