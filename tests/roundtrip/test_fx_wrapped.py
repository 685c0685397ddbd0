"""A function marked `torch.fx.wrap` (timm's `maybe_add_mask`, which every timm ViT's attention calls):
while a trace runs, torch.fx puts a stand-in for it in its module's globals (functools.wraps of it,
taking *args), and the MakeFx trace reads that. Spelled as the stand-in, the global read "changed during
the captured call" once the trace put the function back, and the capture was refused. It is spelled as
the function it stands in for, so the capture serves, and a change to that function is still refused.
Each step runs in a fresh process, which imports the module as it is on disk then."""
from __future__ import annotations

import json

from conftest import run_fresh

MODULE = '''import torch
import torch.fx


@torch.fx.wrap
def maybe_add(x, bias=None):
    return x if bias is None else x + bias


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return maybe_add(self.lin(x)).relu()


def step(model, x):
    return model(x)
'''

CAPTURE = r"""
import torch, precompile, fx_wrapped
torch.manual_seed(0)
with torch.no_grad(), precompile.capture(fx_wrapped.step, artifact_path="out.py", cache_path="out.cache",
                                         tracer=precompile.MakeFxTracer(), backend="eager") as cap:
    cap(fx_wrapped.Net(), torch.ones(2, 4))
"""

SERVE = r"""
import json, torch, precompile, fx_wrapped
torch.manual_seed(0)
model, x = fx_wrapped.Net(), torch.ones(2, 4)
try:
    served = precompile.load("out.py", "out.cache")
    with torch.no_grad():
        print(json.dumps(torch.equal(served(model, x), fx_wrapped.step(model, x))))
except precompile.PrecompileError as exc:
    print(json.dumps(str(exc)))
"""


def test_a_function_marked_fx_wrap_captures_serves_and_a_changed_default_is_refused(tmp_path):
    (tmp_path / "fx_wrapped.py").write_text(MODULE)
    proc = run_fresh(CAPTURE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_fresh(SERVE, cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1]) is True, proc.stdout + proc.stderr
    (tmp_path / "fx_wrapped.py").write_text(MODULE.replace("bias=None", "bias=1.0"))
    proc = run_fresh(SERVE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    refused = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(refused, str) and "fx_wrapped.maybe_add" in refused, refused
