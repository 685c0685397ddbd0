"""Capture a computation and prove the artifact serves it: in a fresh process, under
`no_compilation()`, returning what eager returns within a tolerance."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

SERVE_TIMEOUT_S = 600


class CapturedPair(NamedTuple):
    python_code: Path
    cache: Path


def capture_and_serve(fn, args: tuple, prefix: Path, *, tolerance: float | None, capture_kwargs: dict[str, Any]) -> CapturedPair:
    """Capture `fn(*args)` into `prefix`.py/.cache, then check a fresh process serves what eager returned."""
    import torch

    import precompile

    pair = CapturedPair(prefix.with_name(prefix.name + ".py"), prefix.with_name(prefix.name + ".cache"))
    inputs, served_path = prefix.with_name(prefix.name + ".inputs.pt"), prefix.with_name(prefix.name + ".served.pt")
    try:
        torch.save(list(args), inputs)  # before anything runs: the state the fresh process serves
    except Exception as exc:
        raise TypeError(f"precompile_snapshot serves the artifact in a fresh process, so torch.save must pickle the "
                        f"arguments (a model whose class is importable by module name, not defined in a function): {exc}") from exc
    expected = fn(*args)
    with precompile.capture(fn, artifact_path=str(pair.python_code), cache_path=str(pair.cache),
                            **{"verbose": False, **capture_kwargs}) as cap:
        cap(*args)
    _serve_fresh(pair, inputs, served_path)
    served = torch.load(served_path, weights_only=False)
    try:
        torch.testing.assert_close(served, expected, rtol=tolerance, atol=tolerance)
    except AssertionError as exc:
        raise AssertionError(f"the artifact served in a fresh process under no_compilation() differs from eager: {exc}") from None
    return pair


def _serve_fresh(pair: CapturedPair, inputs: Path, out: Path) -> None:
    """Run `serve_child` in a fresh interpreter that imports what this one does (the test's modules too)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
    command = [sys.executable, "-m", "precompile.testing.serve_child", str(pair.python_code), str(pair.cache), str(inputs), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SERVE_TIMEOUT_S, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        raise AssertionError(f"the artifact could not be served in a fresh process under no_compilation() "
                             f"(exit {done.returncode}):\n{tail}")
