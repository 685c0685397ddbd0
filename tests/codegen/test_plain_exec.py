"""python_code runs with only torch installed: plain exec, no precompile package importable."""
from __future__ import annotations

from conftest import fresh_json

WITHOUT_PRECOMPILE = r"""
import json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "precompile" or name.startswith("precompile."):
            raise ImportError("precompile is not installed here")
sys.meta_path.insert(0, Block())
import torch
from cases import CASES
ns = {}
exec(open(sys.argv[1]).read(), ns)
case = CASES["mlp_batchnorm"]
with torch.set_grad_enabled(case.grad):  # the grad mode it was captured in
    served = ns["forward"](*case.args())
    eager = case.fn(*case.args())
    try:
        ns["forward"](case.args()[0], torch.ones(1, 8, dtype=torch.float64))
    except RuntimeError as exc:
        error = [[c.__name__ for c in type(exc).__mro__[:3]], type(exc).__module__, str(exc)]
print(json.dumps({"close": torch.allclose(served, eager), "error": error,
                  "precompile_imported": any(m.startswith("precompile") for m in sys.modules)}))
"""


def test_python_code_serves_and_fails_clearly_without_precompile(captured):
    artifact, _ = captured["mlp_batchnorm"]
    report = fresh_json(WITHOUT_PRECOMPILE, str(artifact))
    assert report["close"] is True
    assert report["precompile_imported"] is False
    names, module, message = report["error"]
    # the driver's local twins, named and related as in precompile.errors
    assert (names, module) == (["CallMismatch", "PrecompileError", "RuntimeError"], "builtins")
    assert message.startswith("this artifact: input args[1]: expected shape (6, 8), got (1, 8)")


def _scaled(x, k):
    return x * k


def test_a_tensor_where_a_constant_was_captured_is_a_call_mismatch(tmp_path):
    """The driver compares a baked-in constant by type first: a tensor or array there would compare
    elementwise (and raise its own error) before the mismatch could be named."""
    import pytest
    import torch

    import precompile

    with precompile.capture(_scaled, artifact_path=tmp_path / "k.py", cache_path=tmp_path / "k.cache",
                            tracer=precompile.MakeFxTracer(), backend="eager") as cap:
        cap(torch.ones(2), 3)
    served = precompile.load(tmp_path / "k.py", tmp_path / "k.cache")
    for value in (torch.tensor([3, 3]), 3.0):
        with pytest.raises(precompile.CallMismatch, match=r"input args\[1\] is .* but the artifact was captured with 3"):
            served(torch.ones(2), value)
    assert torch.equal(served(torch.ones(2), 3), torch.full((2,), 3.0))
