"""Where in the user's code Dynamo made a guard: the line a rendered guard names beside its check.

Dynamo records, with each guard, the stack of the user's frames it was tracing when it added the guard
(`Guard.user_stack`). The origin is the innermost of those frames outside torch (a guard on a Linear's
weight is made inside torch's `Linear.forward`; its origin is the user's line that called the Linear),
written as `path:line in function: code` with the path spelled from the module's dotted name
(`mylib/model.py`), never the absolute path of this machine, so that two captures of one model render
the same text anywhere. A frame whose file is no imported module's is named by its file's base name.
"""
from __future__ import annotations

import functools
import os
import sys
import traceback

import torch

MAX_CODE = 100
"""The most characters of the user's line written beside its place."""
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


def origin(guard) -> str | None:
    """The guard's origin as python_code names it, or None where Dynamo recorded no user frame."""
    frames = list(getattr(guard, "user_stack", None) or ())
    if not frames:
        return None
    frame = next((f for f in reversed(frames) if not _in_torch(f.filename)), frames[-1])
    where = f"{_display_path(frame.filename)}:{frame.lineno} in {frame.name}"
    code = " ".join(_code_of(frame).split())
    text = f"{where}: {code if len(code) <= MAX_CODE else code[:MAX_CODE - 3] + '...'}" if code else where
    return "".join(c if c.isprintable() else "?" for c in text)  # one comment line, whatever the file holds


def _code_of(frame: traceback.FrameSummary) -> str:
    try:
        return frame.line or ""
    except Exception:  # a source that cannot be read: the place alone
        return ""


@functools.lru_cache(maxsize=1024)
def _in_torch(filename: str) -> bool:
    return os.path.realpath(filename).startswith(_TORCH_DIR)


@functools.lru_cache(maxsize=1024)
def _display_path(filename: str) -> str:
    real, base = os.path.realpath(filename), os.path.basename(filename)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)  # the base name first: a realpath per module is slow
        if isinstance(file, str) and os.path.basename(file) == base and os.path.realpath(file) == real:
            package = os.path.basename(file) == "__init__.py"
            return name.replace(".", "/") + ("/__init__.py" if package else ".py")
    return os.path.basename(filename)
