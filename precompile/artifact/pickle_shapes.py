"""How a reviewed class may be built while unpickling: only in the shape torch's own pickling writes
for it (`CallShape`, named per class in a review table such as `formats.mega_cache_policy`).

A review says what a class's reconstruction does, and that holds only for the way torch pickles it:
copyreg's reconstruction (NEWOBJ, or `copyreg._reconstructor` on base `object`, with no arguments)
then a BUILD of its state never runs its `__init__`; a call with arguments does (`CompiledFxGraph(...)`
reads the files its graph names). So `off_shape` judges each call of a class that has a shape, by
opcode and by the copyreg helpers that call the class they are given, and names every other call.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from precompile.artifact.pickle_symbols import Global, summarize

CallShape = Literal["built", "enum", "fields", "list", "value"]
ALLOWED: dict[str, str] = {
    "built": "torch builds it only by copyreg reconstruction, the class with no arguments (NEWOBJ, or "
             "copyreg._reconstructor on base object), then a BUILD of its state",
    "enum": "torch only looks it up by value: the enum called with one literal",
    "fields": "torch only calls it with its fields as positional arguments (its __reduce__)",
    "list": "torch only calls it with one list (its __reduce__)",
    "value": "torch only holds it as a value, never calls it while unpickling",
}
"""What each shape allows, as a finding states it."""
_NEWOBJ, _NEWOBJ_EX, _RECONSTRUCTOR = ("copyreg", "__newobj__"), ("copyreg", "__newobj_ex__"), ("copyreg", "_reconstructor")
_FROM_TYPE = ("torch._tensor", "_rebuild_from_type_v2")
_OBJECT = ("builtins", "object")
_LITERALS = (type(None), bool, int, float, str, bytes)
_SHOWN_ARGUMENTS = 4


def off_shape(shape_of: Callable[[str, str], CallShape | None], func: Global, args, kwargs, opcode: str) -> list[tuple[Global, str]]:
    """Each class with a shape that this call (`opcode` of `func` on `args`, NEWOBJ_EX's `kwargs`)
    builds otherwise than its shape allows, with what the call does and what is allowed."""
    found: list[tuple[Global, str]] = []

    def judge(cls, form: str, how: str, call_args, call_kwargs=None) -> None:
        shape = shape_of(cls.module, cls.name) if isinstance(cls, Global) and cls.resolved else None
        if shape is not None and not _fits(shape, form, call_args, call_kwargs):
            found.append((cls, f"{how} {_arguments(call_args, call_kwargs)}; {ALLOWED[shape]}"))

    if opcode in ("NEWOBJ", "NEWOBJ_EX"):
        judge(func, "new", f"{opcode} builds it", args, kwargs)
        return found
    if opcode != "REDUCE":  # INST, OBJ: torch's pickling never writes them for its classes
        judge(func, "other", f"{opcode} calls it", args)
        return found
    judge(func, "call", "REDUCE calls it", args)
    key = (func.module, func.name)
    if not isinstance(args, tuple) or not args:
        return found
    if key == _NEWOBJ:
        judge(args[0], "new", "copyreg.__newobj__ builds it", args[1:])
    elif key == _NEWOBJ_EX and len(args) == 3:
        judge(args[0], "new", "copyreg.__newobj_ex__ builds it", args[1], args[2])
    elif key == _RECONSTRUCTOR and len(args) == 3:
        cls, base, state = args
        if isinstance(base, Global) and (base.module, base.name) == _OBJECT:
            judge(cls, "new", "copyreg._reconstructor builds it", () if state is None else (state,))
        else:  # base.__new__(cls, state), then base.__init__(obj, state)
            judge(cls, "other", f"copyreg._reconstructor builds it on the base {summarize(base)}", (state,))
            judge(base, "other", f"copyreg._reconstructor calls it as the base of {summarize(cls)}", (state,))
    elif key == _FROM_TYPE and len(args) == 4:
        judge(args[0], "other", "torch._tensor._rebuild_from_type_v2 calls it", args[2])
    return found


def _fits(shape: CallShape, form: str, args, kwargs) -> bool:
    """Whether a call of this form ("new": cls.__new__(cls, *args, **kwargs); "call": cls(*args);
    "other": any other) is the one torch writes for a class of this shape."""
    if form == "new":
        return shape == "built" and args == () and kwargs in (None, {})
    if form != "call" or not isinstance(args, tuple):
        return False
    if shape == "enum":
        return len(args) == 1 and type(args[0]) in _LITERALS
    if shape == "fields":
        return len(args) > 0
    if shape == "list":
        return len(args) == 1 and type(args[0]) is list
    return False


def _arguments(args, kwargs) -> str:
    if not isinstance(args, tuple):
        text = f"with arguments {summarize(args)}"
    elif not args:
        text = "with no arguments"
    else:
        shown = ", ".join(summarize(arg) for arg in args[:_SHOWN_ARGUMENTS]) + (", ..." if len(args) > _SHOWN_ARGUMENTS else "")
        text = f"with {len(args)} argument{'s' if len(args) > 1 else ''} ({shown})"
    return text if kwargs in (None, {}) else f"{text} and keywords {summarize(kwargs)}"
