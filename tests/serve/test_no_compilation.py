"""no_compilation(): process-wide, depth-counted, exported to children, and what it forbids."""
from __future__ import annotations

import os
import threading

import pytest
import torch

import precompile
from conftest import run_fresh
from precompile.serve import no_compilation as policy

VAR = "TORCH_PRECOMPILE_NO_COMPILATION"


def sine(x):
    return x.sin()


@pytest.fixture(autouse=True)
def _policy_off():
    assert not policy.active(), "a test left no_compilation() on"
    yield
    assert not policy.active()


def test_nested_and_overlapping_uses_are_depth_counted_across_threads(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    outer = precompile.no_compilation()
    entered, release = threading.Event(), threading.Event()

    def worker():
        with precompile.no_compilation():
            entered.set()
            release.wait(10)

    outer.__enter__()
    thread = threading.Thread(target=worker)
    thread.start()
    entered.wait(10)
    outer.__exit__(None, None, None)  # the worker still owns the policy
    assert policy.active() and os.environ[VAR] == "1"
    release.set()
    thread.join()
    assert not policy.active() and VAR not in os.environ


def test_the_environment_variable_is_restored_after_the_last_owner(monkeypatch):
    monkeypatch.setenv(VAR, "0")
    with precompile.no_compilation():
        with precompile.no_compilation():
            assert os.environ[VAR] == "1"
        assert os.environ[VAR] == "1"
    assert os.environ[VAR] == "0"


def test_dynamo_compiles_and_make_fx_traces_are_refused(tmp_path):
    with precompile.no_compilation():
        with pytest.raises(precompile.PrecompileError, match="no_compilation\\(\\) is active and Dynamo would compile a frame"):
            torch.compile(sine, backend="eager")(torch.ones(2))
        with pytest.raises(precompile.PrecompileError, match="no_compilation\\(\\) is active and make_fx would trace a graph"):
            with precompile.capture(sine, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
                                    tracer=precompile.MakeFxTracer(), backend="eager") as cap:
                cap(torch.ones(2))
    assert not (tmp_path / "m.py").exists()
    torch.compiler.reset()
    assert torch.equal(torch.compile(sine, backend="eager")(torch.ones(2)), torch.ones(2).sin())  # policy off again


def test_an_eager_artifact_loads_and_serves_under_the_policy(captured):
    from cases import CASES

    case = CASES["mlp_batchnorm"]
    with precompile.no_compilation(), torch.set_grad_enabled(case.grad):  # served under the grad mode it was captured in
        served = precompile.load(*captured["mlp_batchnorm"])(*case.args())
    assert served.shape == (6, 4)


STARTUP = r"""
import torch, precompile
try:
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    print("compiled")
except precompile.PrecompileError as exc:
    print("refused")
"""


@pytest.mark.parametrize(("value", "outcome"), [("1", "refused"), ("true", "compiled"), ("0", "compiled")])
def test_the_variable_set_to_exactly_1_at_startup_turns_the_policy_on(value, outcome):
    proc = run_fresh(STARTUP, env={VAR: value})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == outcome
