from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent


# What the compat run (`./dev compat VERSION`, CI on torch 2.11, 2.12 and 2.14.1) covers, by file:
# every fresh-process round trip, the demo, Dynamo, inspect, the torch_compat door and the goldens each
# torch version keeps. The rest (capture API details, refusals, fuzzing) exercises our own code the
# same way on every torch.
COMPAT_FILES = {
    "test_cli_demo.py", "test_codegen_snapshots.py", "test_doctor.py", "test_dynamo.py", "test_dynamo_guards.py",
    "test_dynamo_lowering.py", "test_inductor.py", "test_inspect_cli.py",
    "test_inspect_safety.py", "test_no_compilation.py", "test_plain_exec.py", "test_roundtrip.py",
    "test_torch_compat.py",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in COMPAT_FILES:
            item.add_marker(pytest.mark.compat)


def dynamo_modules_read(artifact: Path) -> list[str]:
    """The torch._dynamo modules a standalone Dynamo artifact's transformed code reads as globals
    (torch 2.11's Dynamo inlines its own polyfills there), so serving it imports Dynamo; not those
    the driver stands in for."""
    import ast

    tree = ast.parse(artifact.read_text(encoding="utf-8"))
    frames = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", None) == "_dynamo_frames")
    return sorted({module for frame in frames for alias, module in frame["import_sources"].items()
                   if (module == "torch._dynamo" or module.startswith("torch._dynamo."))
                   and alias not in frame["stand_ins"]})  # torch._dynamo.utils: the driver's stand-in


def run_fresh(code: str, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with tests/ importable (and `env` added to the environment)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    return proc


def fresh_json(code: str, *args: str, env: dict | None = None):
    proc = run_fresh(code, *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def capture_cases(directory: Path, backend: str) -> dict[str, tuple[Path, Path]]:
    import torch

    import precompile
    from cases import CASES

    pairs = {}
    for name, case in CASES.items():
        artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
        with torch.set_grad_enabled(case.grad), precompile.capture(
            case.fn, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer(), backend=backend
        ) as cap:
            cap(*case.args())
        pairs[name] = (artifact, cache)
    return pairs


@pytest.fixture(scope="session")
def captured(tmp_path_factory):
    """Every case of tests/cases.py captured once per session (MakeFx, eager backend)."""
    return capture_cases(tmp_path_factory.mktemp("captured"), "eager")


@pytest.fixture(scope="session")
def captured_inductor(tmp_path_factory):
    """Every case of tests/cases.py captured once per session with the inductor backend (slow: ~15 s each)."""
    return capture_cases(tmp_path_factory.mktemp("captured-inductor"), "inductor")
