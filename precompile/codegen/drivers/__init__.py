"""Drivers: the code that serves an artifact, kept as real, tested modules.

The codegen includes a driver's source verbatim in python_code (see `source_of`), where it is bound
to that artifact's metadata literals. Drivers import only torch and the standard library, and fall
back to a local twin of PrecompileError when the precompile package is not installed.
"""
from __future__ import annotations

from importlib import resources


def source_of(name: str) -> str:
    """The text of driver module `name`, as the templates include it."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
