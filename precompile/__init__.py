"""precompile: capture a PyTorch computation ahead of time into a self-contained, inspectable artifact.

Importing this package does not import torch: `precompile.schema` and `precompile.inspect` stay
torch-free, and the torch side (capture, load, tracers) is imported on first use of its names.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from precompile.errors import PrecompileError, PrecompileWarning
from precompile.runtime.no_compilation import activate_from_environment as _activate_from_environment
from precompile.runtime.no_compilation import no_compilation

__version__ = "0.1.0"

# public name -> module that defines it; resolved lazily so that `import precompile` stays cheap.
_LAZY = {
    "capture": "precompile.runtime.capture",
    "Capture": "precompile.runtime.capture",
    "load": "precompile.runtime.load",
    "PrecompiledRunnable": "precompile.runtime.load",
    "MakeFxTracer": "precompile.runtime.tracers",
    "DynamoTracer": "precompile.runtime.tracers",
    "PrecompileSummary": "precompile.schema.summary",
}

# public submodules that import torch, also resolved on first use: precompile.distributed.load_everywhere
_LAZY_MODULES = ("distributed",)

__all__ = ["PrecompileError", "PrecompileWarning", "no_compilation", *_LAZY, *_LAZY_MODULES]

if TYPE_CHECKING:
    from precompile.runtime.capture import Capture, capture
    from precompile.runtime.load import PrecompiledRunnable, load
    from precompile.runtime.tracers import DynamoTracer, MakeFxTracer
    from precompile.schema.summary import PrecompileSummary


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
