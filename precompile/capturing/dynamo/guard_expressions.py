"""What a rendered guard may say: the checks on a guard's source text (which names it reads, which
functions it calls, a module imported by name) and the literals its values are written as (or, for a
value no literal states, the check of its type and value)."""
from __future__ import annotations

import ast
import math

import torch

PAIRED = r"(?:[^()]|\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))+"
"""A regex of guard source text whose parentheses pair, three deep (`dict(type(L['m']).__dict__)['MODES']`)."""


class Unrenderable(Exception):
    """A kept guard with no faithful rendering here: `str()` names it and says why."""



def names_in(expr: str, allowed: frozenset, calls: frozenset | None, label: str, dotted: frozenset = frozenset()) -> None:
    """Refuse `expr` unless every name it reads is in `allowed` (or is the module of an attribute
    `dotted` names: `torch.float64`, a dict key Dynamo writes as the dtype's repr) and every call is
    to one of `calls` (any, where None)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise Unrenderable(f"{label}: {expr!r} is not a Python expression ({exc.msg})") from None
    # A module a frame imports by name (Dynamo's ImportSource): __import__ of one string literal.
    imports = {id(node) for node in ast.walk(tree) if isinstance(node, ast.Call) and _imports_by_name(node)}
    named = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and f"{node.value.id}.{node.attr}" in dotted}
    for node in ast.walk(tree):
        if id(node) in imports or id(node) in named:
            continue
        if isinstance(node, ast.Name) and node.id not in allowed and not (node.id == "__import__" and _import_name_of(node, tree, imports)):
            raise Unrenderable(f"{label}: {expr!r} uses {node.id!r}, which the serving process does not define")
        if isinstance(node, ast.Call) and calls is not None:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in calls:
                raise Unrenderable(f"{label}: {expr!r} calls {name!r}")


def _imports_by_name(call: ast.Call) -> bool:
    return (isinstance(call.func, ast.Name) and call.func.id == "__import__" and not call.keywords
            and len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str))


def _import_name_of(name: ast.Name, tree: ast.AST, imports: set) -> bool:
    """Whether `name` (__import__) is the function of one of the by-name imports."""
    return any(isinstance(node, ast.Call) and id(node) in imports and node.func is name for node in ast.walk(tree))


def reads_back(value) -> bool:
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def literal(value, label: str) -> str:
    text = ordered_repr(value)
    try:
        same = ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        same = False
    if not same:
        raise Unrenderable(f"{label}: its value {text[:80]} has no literal that reads back equal")
    return text


def unliteral_check(source: str, value) -> str | None:
    """The check of a constant no literal states, by its type and value: a torch dtype or device
    (`torch.float32`, `torch.device('cpu')`), a float that is nan or infinite (a mask's float('-inf'),
    a limit's float('inf')); None for any other value."""
    if type(value) is torch.dtype and getattr(torch, str(value).removeprefix("torch."), None) is value:
        return f"type({source}) is torch.dtype and {source} == {value}"
    if type(value) is torch.device:
        return f"type({source}) is torch.device and {source} == torch.device({str(value)!r})"
    if type(value) is float and not math.isfinite(value):
        check = f"math.isnan({source})" if math.isnan(value) else f"{source} == {'-' if value < 0 else ''}math.inf"
        return f"type({source}) is float and {check}"
    return None


def ordered_repr(value) -> str:
    """repr(value), but a set's members sorted by their spelling: a set of str iterates in the order of the
    process's string hash seed, and two captures of the same value must render the same check."""
    kind = type(value)
    if kind in (set, frozenset):
        inner = "{" + ", ".join(sorted(ordered_repr(item) for item in value)) + "}"
        if kind is set:
            return inner if value else "set()"
        return f"frozenset({inner})" if value else "frozenset()"
    if kind is tuple:
        items = [ordered_repr(item) for item in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind is list:
        return "[" + ", ".join(ordered_repr(item) for item in value) + "]"
    if kind is dict:
        return "{" + ", ".join(f"{ordered_repr(key)}: {ordered_repr(item)}" for key, item in value.items()) + "}"
    return repr(value)
