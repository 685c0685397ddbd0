"""Whose code a frame runs, for the MakeFx read recorder (reads.py): fn's and the libraries it calls,
whose reads are settings the artifact checks, or torch's, precompile's, the standard library's and the
libraries torch's tracing runs, whose reads are not fn's.
"""
from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

import torch

# torch's and precompile's own code, and code that is no file (<frozen ...>, <string>), are not fn's
# reads; torch's layers are (Dropout's forward reads self.p and self.training), its Module machinery not.
_PRECOMPILE = str(Path(__file__).parent.parent.parent) + "/"


def _package_dirs(names: tuple[str, ...]) -> tuple[str, ...]:
    """Where each installed package of `names` lives (found without importing it)."""
    found = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            found += [str(Path(location)) + "/" for location in (spec.submodule_search_locations or ())]
    return tuple(found)


# The libraries torch's tracing machinery runs (symbolic shapes' sympy and its mpmath): what they read is
# theirs, not fn's (a mark_unbacked trace ran sympy's code on every size expression).
_SKIPPED_ROOTS = (str(Path(torch.__file__).parent) + "/", _PRECOMPILE, "<", *_package_dirs(("sympy", "mpmath")))
_LAYERS = str(Path(torch.__file__).parent / "nn" / "modules") + "/"
_MACHINERY = _LAYERS + "module.py"
_STDLIB = sysconfig.get_paths()["stdlib"] + "/"
_SITE = tuple({sysconfig.get_paths()[key] + "/" for key in ("purelib", "platlib")})


_CALLS_FOR_FN = ("/contextlib.py", "/functools.py")


def _stdlib(filename: str) -> bool:
    return filename.startswith(_STDLIB) and not filename.startswith(_SITE)


def in_trace(frame) -> bool:
    """Whether a frame runs for fn's call: up its stack, precompile's trace (which calls fn) comes
    before any frame of the standard library or the import system. Code those call back (a logging
    handler, an import hook, a module's body as it is imported) runs beside the trace, not in it;
    code contextlib or functools calls for fn (a @contextmanager's body, a cached_property's getter)
    runs in it."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_PRECOMPILE):
            return True
        if (_stdlib(filename) and not filename.endswith(_CALLS_FOR_FN)) or filename.startswith("<frozen"):
            return False
        frame = frame.f_back
    return False


def skipped(filename: str) -> bool:
    """Code whose reads are not fn's: torch but its layers, precompile, the standard library."""
    if filename.startswith(_LAYERS):
        return filename == _MACHINERY
    return filename.startswith(_SKIPPED_ROOTS) or _stdlib(filename)
