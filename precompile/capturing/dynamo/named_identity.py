"""Identity guards kept by name: a dropped identity guard (ID_MATCH, CLOSURE_MATCH, CLASS_MATCH,
...) whose object a serving process can find again by module and qualified name is checked there
against that object, instead of going unchecked.

Dynamo refuses to serialize identity guards (they hold process-local ids). Many pin objects that
have a name: the function a decorator's wrapper closes over, a class, an enum member, a module. The
artifact records `TYPE source is module:qualname[@unwraps]`, and the driver resolves the reference at
load and checks the source against it on every call. Which guards qualify is decided here, at
capture, and only when the reference resolves to the very same object in the capturing process.
An identity guard on an immutable constant (a str, bool, None, int or float: a config field such as
`config._attn_implementation_internal`) is recorded as `ID_MATCH source == literal` instead and
checked by type and value.
"""
from __future__ import annotations

import ast
import enum
import importlib
import re
import types

from precompile.capturing.dynamo.guard_expressions import reads_back

# Identity-checking guard types a reference can stand in for.
NAMEABLE = frozenset({"ID_MATCH", "CLOSURE_MATCH", "CLASS_MATCH", "FUNCTION_MATCH", "MODULE_MATCH", "BUILTIN_MATCH"})

# A guard source the driver can walk without eval: a local (x, or L['x']) or a global (G['x']), then
# .attr, [0] or ['key'] steps, optionally inside type(...), which more steps may follow
# (`type(L['model'].act).__call__`: what calling an object runs).
_ROOT, _STEP = r"(?:[LG]\['[^'\]]+'\]|[A-Za-z_]\w*)", r"(?:\.\w+|\[\d+\]|\['[^'\]]+'\])"
SOURCE = re.compile(rf"(?:type\({_ROOT}{_STEP}*\){_STEP}*|{_ROOT}{_STEP}*)")

_MAX_UNWRAPS = 8
# Dynamo's spelling of a read from a class's own dict (a class attribute `self.MODE`, one inherited,
# `type(self).__mro__[1]`, a property's getter), as the walk above spells it: `type(X)...__dict__[...]`.
_CLASS_DICT = re.compile(rf"dict\((type\({_ROOT}{_STEP}*\){_STEP}*\.__dict__)\)")


def walkable(name: str) -> str:
    """A guard source with Dynamo's `dict(type(X).__dict__)` spelled as the walk `type(X).__dict__`
    that SOURCE matches and the driver reads (the same object: the class's own namespace)."""
    return _CLASS_DICT.sub(r"\1", name)


def reference(value) -> str | None:
    """`module:qualname` (with `@N` when the name holds a wrapper N `__wrapped__` steps above the
    object, as functools.wraps leaves a decorated method) that resolves to `value` itself; None if
    the object has no such name (an instance, a local function, something in __main__)."""
    module: str | None
    qualname: str | None
    if isinstance(value, types.ModuleType):
        module, qualname = value.__name__, ""  # a module is named by its module part alone
    elif isinstance(value, enum.Enum):
        module, qualname = type(value).__module__, f"{type(value).__qualname__}.{value.name}"
    else:
        module, qualname = _text(getattr(value, "__module__", None)), _text(getattr(value, "__qualname__", None))
    if module is None or qualname is None or module == "__main__" or "<" in qualname:
        return None
    names = [qualname]
    name = _text(getattr(value, "__name__", None))
    if name is not None and name != qualname and not isinstance(value, type):
        names.append(name)  # a builtin a module exports under its name: torch.relu's qualname is _VariableFunctionsClass.relu
    for candidate in names:
        ref = _unwrapped_to(value, module, candidate)
        if ref is not None:
            return ref
    if isinstance(value, type) and module == "builtins":
        # An interpreter type builtins does not export (`method`, `cell`, `NoneType`): named by the types
        # module (a function decorated with @torch.no_grad() closes over a bound method).
        return next((f"types:{name}" for name, held in sorted(vars(types).items()) if held is value), None)
    return None


def _unwrapped_to(value, module: str, qualname: str) -> str | None:
    try:
        found = resolve(f"{module}:{qualname}")
    except Exception:  # a name that does not resolve is no reference
        return None
    for unwraps in range(_MAX_UNWRAPS):
        if found is value:
            return f"{module}:{qualname}" + (f"@{unwraps}" if unwraps else "")
        found = getattr(found, "__wrapped__", None)
        if found is None:
            return None
    return None


def resolve(ref: str):
    """The object a reference names (the driver carries its own copy of this walk)."""
    name, _, unwraps = ref.partition("@")
    module, _, qualname = name.partition(":")
    value = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        value = getattr(value, part)
    for _ in range(int(unwraps or 0)):
        value = value.__wrapped__
    return value


# Immutable constants an identity guard (ID_MATCH) is checked by value for: within one process such an
# object is interned or a singleton, which is why Dynamo pins it by id, and what the compiled code
# relies on is its value (Dynamo folds it in as a constant), which another process can compare.
_VALUED = (str, bool, type(None), int, float)
CHECK = re.compile(rf"({SOURCE.pattern}) (is|==) (.+)")
"""`source is reference` or `source == literal` (the line's text after its guard type)."""


def renderable(line: str) -> bool:
    """Whether the guard renderer states a by-name line as Python (`source is reference`, `source ==
    literal`); the lines only the driver checks (a pinned length, a ContextVar's value, `float('inf')`:
    guard_pickling) are not."""
    match = CHECK.fullmatch(line.split(" ", 1)[-1])
    if match is None or match.group(2) == "is":
        return match is not None
    try:
        ast.literal_eval(match.group(3))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def valued_check(entry) -> str | None:
    """`ID_MATCH source == literal` for an identity guard on a str, bool, None, int or float (checked
    by type and value), else None."""
    name = walkable(entry.name)
    if entry.guard_type != "ID_MATCH" or not entry.has_value or type(entry.value) not in _VALUED:
        return None
    if not SOURCE.fullmatch(name) or name.startswith("type(") and "__dict__" not in name:
        return None
    text = repr(entry.value)
    try:
        same = ast.literal_eval(text)
    except (ValueError, SyntaxError):  # inf, nan
        return None
    if type(same) is not type(entry.value) or same != entry.value:
        return None
    return f"{entry.guard_type} {name} == {text}"


def named_check(entry) -> str | None:
    """`TYPE source is reference` for a guard checkable by name, else None."""
    name = walkable(entry.name)
    if entry.guard_type not in NAMEABLE or not entry.has_value or not SOURCE.fullmatch(name):
        return None
    ref = reference(entry.value)
    return None if ref is None else f"{entry.guard_type} {name} is {ref}"


def code_checks(entry) -> tuple[str, ...] | None:
    """For a dropped CLOSURE_MATCH on a function no name reaches (a lambda, a closure: `self.act =
    lambda x: x * 0.5`), the by-value checks that tell its code from another's where Dynamo's check
    compared code objects: where it is defined (module, qualified name) and what its code is (its
    bytecode, constants and names, which a move leaves alike; its first line where a constant is no
    literal). A lambda swapped for another then misses instead of serving the captured one."""
    value = entry.value if entry.has_value else None
    name = walkable(entry.name)
    if entry.guard_type != "CLOSURE_MATCH" or not isinstance(value, types.FunctionType):
        return None
    if not SOURCE.fullmatch(name) or name.startswith("type(") and "__dict__" not in name:
        return None
    module, code = _text(getattr(value, "__module__", None)), value.__code__
    if module is None:
        return None
    where = (f"{entry.guard_type} {name}.__module__ == {module!r}",
             f"{entry.guard_type} {name}.__code__.co_qualname == {getattr(code, 'co_qualname', value.__qualname__)!r}")
    what = {"co_code": code.co_code, "co_consts": code.co_consts, "co_names": code.co_names}
    if not all(reads_back(part) for part in what.values()):  # a nested function among its constants
        return (*where, f"{entry.guard_type} {name}.__code__.co_firstlineno == {code.co_firstlineno!r}")
    # What it does, not where it starts: moved (lines added above it), it is the same code.
    return (*where, *(f"{entry.guard_type} {name}.__code__.{field} == {part!r}" for field, part in what.items()))


FORWARD_MATCH = "FORWARD_MATCH"
"""The slot of the checks precompile adds of what a module's class runs as its forward."""


def forward_checks(entry, classes: set) -> tuple[str, ...] | None:
    """For a kept TYPE_MATCH on a module, once per class (`classes`: the ones already checked): the
    by-value checks of the forward and the __call__ its class holds, by module and qualified name. Dynamo inlines a
    module's forward without guarding it (its instance dict is: NOT_PRESENT_IN_GENERIC_DICT), so a
    class patched after capture (`nn.LayerNorm.forward = ...`, `nn.Linear.__call__ = ...` as profiling
    shims do) would serve the captured forward; read
    when the call comes, a patch made before load is seen too."""
    value = entry.value if entry.has_value else None
    kind = type(value)
    if entry.guard_type != "TYPE_MATCH" or kind in classes or not any(k.__name__ == "Module" and k.__module__ == "torch.nn.modules.module"
                                                                      for k in kind.__mro__):
        return None
    if not SOURCE.fullmatch(entry.name) or entry.name.startswith("type("):
        return None
    lines = []
    for name in ("forward", "__call__"):  # what calling it runs: Module's call machinery, unless patched
        method = getattr(kind, name, None)
        module, qualname = _text(getattr(method, "__module__", None)), _text(getattr(method, "__qualname__", None))
        if not isinstance(method, types.FunctionType) or module is None or qualname is None:
            return None
        lines += [f"{FORWARD_MATCH} {entry.name}.{name}.__func__.__module__ == {module!r}",
                  f"{FORWARD_MATCH} {entry.name}.{name}.__func__.__qualname__ == {qualname!r}"]
    classes.add(kind)
    return tuple(lines)


def _text(value: object) -> str | None:
    """A dunder name attribute as text; None where an object sets it to something else."""
    return value if isinstance(value, str) else None
