from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def run_fresh(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with tests/ importable; fail with its stderr if it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    return proc


def fresh_json(code: str, *args: str):
    proc = run_fresh(code, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def captured(tmp_path_factory):
    """Every case of tests/cases.py captured once per session (MakeFx, eager backend)."""
    import torch

    import precompile
    from cases import CASES

    out = tmp_path_factory.mktemp("captured")
    pairs = {}
    for name, case in CASES.items():
        artifact, cache = out / f"{name}.py", out / f"{name}.cache"
        with torch.set_grad_enabled(case.grad), precompile.capture(
            case.fn, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer(), backend="eager"
        ) as cap:
            cap(*case.args())
        pairs[name] = (artifact, cache)
    return pairs
