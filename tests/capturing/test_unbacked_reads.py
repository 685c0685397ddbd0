"""A mark_unbacked capture records what fn reads, not what torch's symbolic shapes read while tracing it.

Observed (torch 2.13 and 2.15): a MakeFx inductor capture of `(x * 2).sum(0)` with dim 0 marked
unbacked (min 2, max 8) lists 74 to 87 lines on sympy in `precompile guards` (52 sympy module globals
checked on every call, 8 sympy closure cells "not checked", the rest as warnings), none of which fn
reads; and `guards` never says the dim is bounded [2, 8], which the driver checks.
"""
from __future__ import annotations

import torch
from test_inspect_helpers import run_cli

import precompile


def _double_and_sum(x):
    return (x * 2).sum(0)


def test_a_mark_unbacked_capture_records_no_sympy_state_and_guards_names_the_bounds(tmp_path, capsys):
    x = torch.randn(5, 3)
    torch._dynamo.decorators.mark_unbacked(x, 0, min=2, max=8)
    with torch.no_grad(), precompile.capture(_double_and_sum, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
                                             tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
        cap(x)
    rc, out, err = run_cli(capsys, ["guards", str(tmp_path / "m.py"), str(tmp_path / "m.cache")])
    assert rc == 0, err
    sympy = [line.strip() for line in out.splitlines() if "sympy." in line]
    assert not sympy, f"{len(sympy)} entries on sympy's own state, e.g. {sympy[:3]}"
    assert "dim 0 unbacked u0 in [2, 8]" in out, out  # the bounds the driver checks on every call
