"""Capture a computation and prove the artifact serves it: in a fresh process, under
`no_compilation()`, returning what eager returns within a tolerance."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

SERVE_TIMEOUT_S = 600


class CapturedPair(NamedTuple):
    python_code: Path
    cache: Path


def capture_and_serve(fn, args: tuple, prefix: Path, *, tolerance: float | None, capture_kwargs: dict[str, Any],
                      factory: Callable[[], Any] | None = None) -> CapturedPair:
    """Capture `fn(*args)` into `prefix`.py/.cache, then check a fresh process serves what eager returns.

    Given `factory`, the arguments are `factory()`'s, built here to capture and built again in the fresh
    process (as a serving process builds its model), which serves them, then runs `fn` eagerly on them."""
    import torch

    import precompile

    pair = CapturedPair(prefix.with_name(prefix.name + ".py"), prefix.with_name(prefix.name + ".cache"))
    inputs, served_path = prefix.with_name(prefix.name + ".inputs.pt"), prefix.with_name(prefix.name + ".served.pt")
    if factory is not None:
        _save_factory(fn, factory, inputs)
        args = _built(factory)
    else:
        try:
            torch.save(("args", list(args)), inputs)  # before anything runs: the state the fresh process serves
        except Exception as exc:
            raise TypeError(f"precompile_snapshot serves the artifact in a fresh process, so torch.save must pickle the "
                            f"arguments (a model whose class is importable by module name, not defined in a function), "
                            f"or pass factory= to build them there: {exc}") from exc
    expected = None if factory is not None else fn(*args)
    with precompile.capture(fn, artifact_path=str(pair.python_code), cache_path=str(pair.cache),
                            **{"verbose": False, **capture_kwargs}) as cap:
        cap(*args)
    _serve_fresh(pair, inputs, served_path)
    served, eager = torch.load(served_path, weights_only=False)
    try:
        torch.testing.assert_close(served, expected if factory is None else eager, rtol=tolerance, atol=tolerance)
    except AssertionError as exc:
        raise AssertionError(f"the artifact served in a fresh process under no_compilation() differs from eager: {exc}") from None
    return pair


def _built(factory: Callable[[], Any]) -> tuple:
    """`factory()`'s arguments: a tuple (or list) of them."""
    built = factory()
    if not isinstance(built, (tuple, list)):
        raise TypeError(f"precompile_snapshot's factory {factory.__qualname__} returned a {type(built).__name__}: "
                        f"it must return the tuple of arguments to call fn with, e.g. `return model, x`")
    return tuple(built)


def _save_factory(fn, factory: Callable[[], Any], inputs: Path) -> None:
    """Name `fn` and `factory` for the fresh process (pickle names a function by module and name)."""
    import torch

    for role, function in (("fn", fn), ("factory", factory)):
        try:
            pickle.dumps(function)
        except Exception as exc:
            raise TypeError(f"precompile_snapshot's {role} {getattr(function, '__qualname__', function)!r} must be "
                            f"importable by module name (a module-level function, not a lambda or one defined in a "
                            f"function): the fresh process imports it to build and run the model: {exc}") from None
    torch.save(("factory", (fn, factory)), inputs)


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
