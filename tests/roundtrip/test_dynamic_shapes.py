"""Other batch sizes and sequence lengths (issue 55 item 1): a Dynamo artifact of a transformers decoder
(tiny GPT-2 from a config) captured from two batch sizes and two sequence lengths holds Dynamo's
automatic-dynamic variant, which serves a third of each in a fresh process; so does one captured from
one call whose dims were marked with torch._dynamo.mark_dynamic. Eager backend."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import precompile
from conftest import ROOT, fresh_json

pytest.importorskip("transformers")
sys.path.insert(0, str(ROOT))
from bench.zoo_models import ZOO, _ids, lm_step  # noqa: E402  (bench/ is importable from the repository root)

SERVE = r"""
import json, sys, torch, precompile
sys.path.insert(0, sys.argv[2])
from bench.zoo_models import ZOO, _ids, lm_step
model, _ = ZOO["gpt2"].instantiate()
served = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
report = {}
with torch.no_grad(), precompile.no_compilation():
    for batch, length in ((5, 13), (5, 7), (4, 20)):
        ids = _ids(batch, length)
        report[f"{batch}x{length}"] = torch.allclose(served(model, ids), lm_step(model, ids), atol=1e-5)
print(json.dumps(report))
"""


def _capture(path: Path, shapes, marked: bool = False):
    model, _ = ZOO["gpt2"].instantiate()
    with torch.no_grad(), precompile.capture(lm_step, artifact_path=path.with_suffix(".py"),
                                             cache_path=path.with_suffix(".cache"), backend="eager") as cap:
        for shape in shapes:
            ids = _ids(*shape)
            if marked:
                torch._dynamo.mark_dynamic(ids, 0)
                torch._dynamo.mark_dynamic(ids, 1)
            cap(model, ids)
    return cap.summary()


EXPECTED = {"5x13": True, "5x7": True, "4x20": True}


def test_two_batch_sizes_and_two_lengths_serve_a_third_of_each_in_a_fresh_process(tmp_path):
    summary = _capture(tmp_path / "two", [(2, 7), (3, 9)])
    assert summary.guarded_codes == 2  # the first call's static variant, then Dynamo's dynamic one
    assert fresh_json(SERVE, str(tmp_path / "two"), str(ROOT)) == EXPECTED


def test_dims_marked_with_mark_dynamic_serve_other_sizes_from_one_call(tmp_path):
    summary = _capture(tmp_path / "marked", [(2, 7)], marked=True)
    assert summary.guarded_codes == 1
    assert fresh_json(SERVE, str(tmp_path / "marked"), str(ROOT)) == EXPECTED
