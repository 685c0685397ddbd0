"""Fresh-process round trips: every representative capture served against eager, twice."""
from __future__ import annotations

import json

from cases import CASES
from conftest import fresh_json

SERVE_AND_COMPARE = r"""
import contextlib, json, sys, warnings
import torch
import torch.utils._pytree as pytree
import precompile
from cases import CASES

def close(a, b):
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb:
        return False
    return all(torch.allclose(x, y, atol=1e-5) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb))

report = {}
policy = precompile.no_compilation() if sys.argv[2:] == ["no_compilation"] else contextlib.nullcontext()
policy.__enter__()
for name, (artifact, cache) in json.loads(sys.argv[1]).items():
    case = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", precompile.PrecompileWarning)
        runnable = precompile.load(artifact, cache)
    served_args, eager_args = case.args(), case.args()
    results = []
    with torch.set_grad_enabled(case.grad):
        for _ in range(2):  # the second call accumulates grads and updates buffers again
            served, eager = runnable(*served_args), case.fn(*eager_args)
            results.append(close(served, eager))
    state = []
    for s, e in zip(served_args, eager_args):
        if isinstance(s, torch.nn.Module):
            for (n, ps), (_, pe) in zip(s.named_parameters(), e.named_parameters()):
                same_grad = (ps.grad is None and pe.grad is None) or (
                    ps.grad is not None and pe.grad is not None and torch.allclose(ps.grad, pe.grad, atol=1e-5))
                state.append((n, same_grad, ps.grad is None))
            for (n, bs), (_, be) in zip(s.named_buffers(), e.named_buffers()):
                state.append((n, torch.allclose(bs.double(), be.double(), atol=1e-5), None))
    report[name] = {"results": results, "state": state, "cache_used": runnable.cache_used}
report["inductor imported"] = sorted(m for m in sys.modules if m.startswith("torch._inductor") or m in ("triton", "torch.utils.cpp_extension"))
print(json.dumps(report))
"""


def serve_in_fresh_process(pairs, *mode, env=None):
    report = fresh_json(SERVE_AND_COMPARE, json.dumps({name: [str(a), str(c)] for name, (a, c) in pairs.items()}), *mode, env=env)
    inductor_imported = report.pop("inductor imported")
    assert set(report) == set(CASES)
    for name, outcome in report.items():
        assert outcome["cache_used"], name
        assert outcome["results"] == [True, True], name
        mismatched = [entry for entry in outcome["state"] if not entry[1]]
        assert mismatched == [], (name, mismatched)
    train = {n: grad_is_none for n, _, grad_is_none in report["train_step"]["state"]}
    assert train["3.bias"] is True  # frozen: never receives a grad, like eager
    assert train["0.weight"] is False
    assert train["1.running_mean"] is None  # a buffer, updated in place twice and compared above
    return inductor_imported


def test_fresh_process_round_trips_match_eager(captured):
    serve_in_fresh_process(captured)
