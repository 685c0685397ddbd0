"""Other batch sizes and sequence lengths (issue 55 item 1): a Dynamo artifact of a transformers decoder
(tiny GPT-2 from a config) captured from two batch sizes and two sequence lengths holds Dynamo's
automatic-dynamic variant, which serves a third of each in a fresh process; so does one captured from
one call whose dims were marked with torch._dynamo.mark_dynamic. Eager backend."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, fresh_json

pytest.importorskip("transformers")

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


CAPTURE = r"""
import json, sys, torch, precompile
sys.path.insert(0, sys.argv[2])
from bench.zoo_models import ZOO, _ids, lm_step
path, marked, shapes = sys.argv[1], sys.argv[3] == "marked", json.loads(sys.argv[4])
model, _ = ZOO["gpt2"].instantiate()
with torch.no_grad(), precompile.capture(lm_step, artifact_path=path + ".py", cache_path=path + ".cache",
                                         backend="eager") as cap:
    for shape in shapes:
        ids = _ids(*shape)
        if marked:
            torch._dynamo.mark_dynamic(ids, 0)
            torch._dynamo.mark_dynamic(ids, 1)
        cap(model, ids)
print(json.dumps({"guarded_codes": cap.summary().guarded_codes}))
"""


def _capture(path: Path, shapes, marked: bool = False) -> int:
    """Captured in a fresh process: transformers' registry of model classes (which Dynamo guards by
    position, `list(dict.keys(_CAN_RECORD_REGISTRY))[3]`) then holds GPT-2's alone, as the serving
    process's does; this pytest process has built other models before."""
    report = fresh_json(CAPTURE, str(path), str(ROOT), "marked" if marked else "calls", json.dumps(shapes))
    return report["guarded_codes"]


EXPECTED = {"5x13": True, "5x7": True, "4x20": True}


def test_two_batch_sizes_and_two_lengths_serve_a_third_of_each_in_a_fresh_process(tmp_path):
    assert _capture(tmp_path / "two", [(2, 7), (3, 9)]) == 2  # the first call's static variant, then Dynamo's dynamic one
    assert fresh_json(SERVE, str(tmp_path / "two"), str(ROOT)) == EXPECTED


def test_dims_marked_with_mark_dynamic_serve_other_sizes_from_one_call(tmp_path):
    assert _capture(tmp_path / "marked", [(2, 7)], marked=True) == 1
    assert fresh_json(SERVE, str(tmp_path / "marked"), str(ROOT)) == EXPECTED
