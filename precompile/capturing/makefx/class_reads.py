"""What calling or reading through a model's classes runs, for the MakeFx read log (reads.py): each
module class's `forward` and `__call__`, and the getter of a property the traced code read, noted on
the class defining it, so that a patch on it or on any class it inherits from is a change: patched
after capture, eager runs the patch while the served graph holds what the trace ran."""
from __future__ import annotations

import sys

import torch

from precompile.capturing.makefx.code_origins import skipped
from precompile.codegen.drivers.makefx_reads import spelled

Noted = tuple[dict, dict]
"""Where they are noted: the read log's `globals` and `globals_of` (reads.ReadLog)."""


def _named(klass: type) -> bool:
    """Whether a serving process finds `klass` by its module and qualified name (a class made at run
    time, such as parametrize's `ParametrizedConv1d`, names a module that does not hold it)."""
    module = sys.modules.get(klass.__module__)
    if klass.__module__ == "__main__" or "<" in klass.__qualname__ or module is None:
        return False
    found: object = module
    for part in klass.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is klass


def note_property(noted: Noted, kind: type, name: str) -> None:
    """A property read on an object of `kind` (its getter's frame is noted as it runs): what it runs,
    its getter, checked on the class defining it (`Model.gain.fget`), so one replaced is a change."""
    owner = next((klass for klass in kind.__mro__ if name in vars(klass)), object)
    found = vars(owner).get(name)
    if isinstance(found, property) and _named(owner) and not skipped(getattr(sys.modules[owner.__module__], "__file__", None) or "<"):
        noted[0].setdefault((owner.__module__, f"{owner.__qualname__}.{name}.fget"), str(spelled(found.fget)))
        noted[1].setdefault(owner.__module__, vars(sys.modules[owner.__module__]))


def note_calls(noted: Noted, kind: type) -> None:
    """What calling a module of class `kind` runs: its forward and its __call__ (Module's call
    machinery, unless a class replaced it), read on `kind` (`LayerNorm.forward`, `GPT2MLP.__call__`)
    so that a patch on it or on any class it inherits from is seen: patched after capture, eager runs
    the patch while the served graph holds what the trace ran. A class of __main__ or one defined in a
    function has no name a serving process finds: they are read on the class defining them, where it
    has one (fn's own code there is fn's)."""
    for name in ("forward", "__call__"):
        owner = next((klass for klass in kind.__mro__ if name in vars(klass)), None)
        if owner is None or (name == "forward" and owner is torch.nn.Module):
            continue
        where = kind if _named(kind) else owner
        if not _named(where):
            continue
        spelling = spelled(vars(owner)[name])
        if spelling is not None:
            noted[0].setdefault((where.__module__, f"{where.__qualname__}.{name}"), spelling)
            noted[1].setdefault(where.__module__, vars(sys.modules[where.__module__]))
