"""Drivers: the code that serves an artifact, kept as real, tested modules.

The codegen includes a driver's source verbatim in python_code (see `source_of`), where it is bound
to that artifact's metadata literals. Drivers import only torch and the standard library, and fall
back to a local twin of PrecompileError when the precompile package is not installed. A driver
built on another (makefx on makefx_reads, dynamo on dynamo_checks) is rendered in the section after
it and finds its names among python_code's globals; only as a real module does it import them, so
an artifact runs on its own text, never on the installed package's copy.
"""
from __future__ import annotations

from importlib import resources


def source_of(name: str) -> str:
    """The text of driver module `name`, as the templates include it."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
