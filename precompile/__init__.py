"""precompile: capture a PyTorch computation ahead of time into a self-contained, inspectable artifact.

Importing this package does not import torch: `precompile.artifact` and `precompile.inspect` stay
torch-free, and the torch side (capture, load, tracers) is imported on first use of its names.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from precompile._version import __version__
from precompile.errors import (
    CacheFormatError,
    CallMismatch,
    CaptureRefused,
    CompilationForbidden,
    PairMismatch,
    PrecompileError,
    PrecompileWarning,
)
from precompile.serve.no_compilation import activate_from_environment as _activate_from_environment
from precompile.serve.no_compilation import no_compilation

# public name -> module that defines it; resolved lazily so that `import precompile` stays cheap.
_LAZY = {
    "capture": "precompile.capturing.api",
    "Capture": "precompile.capturing.api",
    "load": "precompile.serve.load",
    "PrecompiledRunnable": "precompile.serve.load",
    "MakeFxTracer": "precompile.capturing.tracers",
    "DynamoTracer": "precompile.capturing.tracers",
    "PrecompileSummary": "precompile.artifact.summary",
}

# public submodules that import torch, also resolved on first use: precompile.distributed.load_everywhere
_LAZY_MODULES = ("distributed",)

__all__ = ["__version__", "PrecompileError", "CaptureRefused", "PairMismatch", "CallMismatch", "CacheFormatError",
           "CompilationForbidden", "PrecompileWarning", "no_compilation", *_LAZY, *_LAZY_MODULES]

if TYPE_CHECKING:
    from precompile.artifact.summary import PrecompileSummary
    from precompile.capturing.api import Capture, capture
    from precompile.capturing.tracers import DynamoTracer, MakeFxTracer
    from precompile.serve.load import PrecompiledRunnable, load


_activate_from_environment()


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"precompile.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'precompile' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))
