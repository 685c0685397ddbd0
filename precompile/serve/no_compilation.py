"""no_compilation(): forbid tracing, lowering, kernel compiles, benchmarking and autotuning.

Process-wide and depth-counted: nested and overlapping uses, from any thread, keep the policy on
until the last owner exits. While it is on, TORCH_PRECOMPILE_NO_COMPILATION=1 is exported so child
processes inherit it; that variable set to exactly "1" when precompile is imported turns the policy
on for the whole process.

Torch-free at import: the gates wrap torch's entry points when their modules are imported (an
import hook), so turning the policy on never imports torch._inductor itself and a primed artifact
keeps its fast start. A gate, once installed, stays and checks the depth on every call.
The first activation checks, from torch's sources, that every gate's target exists on this torch
(torch_compat.missing_gates) and refuses with PrecompileError where one does not.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types

from precompile.errors import CompilationForbidden, PrecompileError
from precompile.torch_compat import NO_COMPILATION_GATES as _GATES
from precompile.torch_compat import missing_gates

ENV_VAR = "TORCH_PRECOMPILE_NO_COMPILATION"
_GATE_MARK = "__precompile_gate__"
"""Set on each gate: a target already gated is not wrapped again."""

_lock = threading.Lock()
_depth = 0
_saved_env: str | None = None
_hook_installed = False


def active() -> bool:
    return _depth > 0


def _gate(function, what: str):
    @functools.wraps(function)
    def gated(*args, **kwargs):
        if _depth > 0:
            raise CompilationForbidden(
                f"no_compilation() is active and {what}: the loaded artifact and its kernel cache do not "
                "cover this call. Capture it (or load its cache file) so nothing compiles at serve time"
            )
        return function(*args, **kwargs)

    setattr(gated, _GATE_MARK, True)
    return gated


def _install_gates(module) -> None:
    for dotted, what in _GATES.get(module.__name__, ()):
        *owner_path, name = dotted.split(".")
        owner = module
        for part in owner_path:
            owner = getattr(owner, part, None)
        current = getattr(owner, name, None) if owner is not None else None
        if current is None or getattr(current, _GATE_MARK, False):
            continue
        if isinstance(owner, type) and isinstance(owner.__dict__.get(name), staticmethod):
            setattr(owner, name, staticmethod(_gate(current, what)))
        elif isinstance(owner, type):
            setattr(owner, name, _gate(current, what))
        else:
            gated = _gate(current, what)
            setattr(owner, name, gated)
            _rebind(current, gated)


def _rebind(original, gated) -> None:
    """Point the module-level names already bound to a gated function (`from m import f`) at its gate.

    Modules imported later bind the gate itself. Only names that are the function's own name are
    looked at (one lookup per module, so the policy keeps a fast start); a name given by
    `import ... as`, a closure, a default argument or an instance attribute is not reached: Triton's
    and Inductor's callers look it up at module level under its own name or go through a gated method.
    """
    name = original.__name__
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType) and module.__dict__.get(name) is original:  # not a lazy stand-in
            module.__dict__[name] = gated


class _GatingLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _install_gates(module)


class _GatingFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of each gated module so its gates go in as soon as it is imported."""

    def find_spec(self, name, path, target=None):
        if name not in _GATES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _GatingLoader(spec.loader)
        return spec


def _ensure_gates() -> None:
    global _hook_installed
    if _hook_installed:
        return
    missing = missing_gates()
    if missing:
        import torch

        raise PrecompileError(
            f"no_compilation() cannot guard this torch {torch.__version__}: it has no {', '.join(missing)}, so "
            "a compile there would go unnoticed; use a torch precompile supports (2.11 to 2.15)"
        )
    sys.meta_path.insert(0, _GatingFinder())
    _hook_installed = True
    for name in _GATES:
        module = sys.modules.get(name)
        if module is not None:
            _install_gates(module)


def _acquire() -> None:
    global _depth, _saved_env
    with _lock:
        _ensure_gates()
        if _depth == 0:
            _saved_env = os.environ.get(ENV_VAR)
            os.environ[ENV_VAR] = "1"
        _depth += 1


def _release() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0:
            if _saved_env is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = _saved_env


class no_compilation:  # a context manager used like a function, as the spec names it
    """Forbid graph/kernel compilation, benchmarking and autotuning in this whole process.

    Use it around a serving worker's lifetime to prove that a loaded artifact and its kernel bundle
    cover every call: anything that would trace, lower, compile a kernel, benchmark or autotune
    raises PrecompileError instead.
    """

    def __init__(self) -> None:
        self._entered = False

    def __enter__(self) -> None:
        if self._entered:
            raise PrecompileError("this no_compilation() is already active; call no_compilation() again to nest")
        _acquire()
        self._entered = True

    def __exit__(self, *exc_info) -> None:
        if self._entered:
            self._entered = False
            _release()


def activate_from_environment() -> None:
    """Turn the policy on for the whole process when TORCH_PRECOMPILE_NO_COMPILATION is exactly "1"."""
    if os.environ.get(ENV_VAR) == "1":
        _acquire()
