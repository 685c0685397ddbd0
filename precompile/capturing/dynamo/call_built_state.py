"""State a model builds on its own calls, built before the capture: refused, since a fresh model misses.

A model that sets an attribute on its first call (`if not self.ready: self.ready = True`, timm
convit's `rel_indices`, transformers' rwkv `layers_are_rescaled`) and was run once before the capture
(the everyday way to get a reference output) is captured in the state that call left: Dynamo guards
it, and a serving process whose model has not run yet misses on its first call.

The capture notes every model attribute when its first call comes. At write time, an attribute is
state built by a call when the code Dynamo traced assigns it (`self.name = ...`, `setattr(self,
"name", ...)`, there or in a method of the model's classes or a function of its module it calls), a
kept guard reads it, and no call of the capture changed it: its value came from before the capture.
Only flags, numbers, strings, None and tensors are such state, and only code outside torch builds it.
"""
from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
import types

import torch

from precompile.artifact.metadata import VariantGuards

# What nn.Module keeps for itself: its tables are compared by the guards of their own, not here.
_MODULE_OWN = frozenset(vars(torch.nn.Module()))


def _modules(fn, args: tuple, kwargs: dict):
    """(path, module) of every module of the nn.Module arguments, by fn's parameter names (e.g.
    ("model.blocks.0.attn", m))."""
    try:
        named = list(inspect.signature(fn).bind(*args, **kwargs).arguments.items())
    except (TypeError, ValueError):
        named = [(f"args[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
    for root, value in named:
        if isinstance(value, torch.nn.Module):
            for path, module in value.named_modules(remove_duplicate=False):
                yield (f"{root}.{path}" if path else root), module


def _same(before, after) -> bool:
    if before is after:
        return True
    try:
        return type(before) is type(after) and isinstance(before, (bool, int, float, str, type(None))) and before == after
    except Exception:  # an object whose == raises is not the same value
        return False


class CallBuiltState:
    """The model attributes as the capture's first call found them; `built_before` names those that
    calls build, that a kept guard reads and that no call of the capture changed."""

    def __init__(self, fn, args: tuple, kwargs: dict) -> None:
        self._first: list[tuple[str, torch.nn.Module, str, object]] = [
            (path, module, name, value)
            for path, module in _modules(fn, args, kwargs)
            for name, value in vars(module).items() if name not in _MODULE_OWN
        ]

    def built_before(self, traced: list[tuple[str, str]], guards: list[VariantGuards]) -> list[str]:
        """`path.name (assigned in ...)` for each attribute the traced sources (`traced`: their text)
        assign, a kept guard reads, and the capture's calls left as its first call found it."""
        classes = {type(module) for _, module, _, _ in self._first}
        assigned = _assigned_names(traced, classes)
        read = "\n".join(line for v in guards for line in v.checks)
        found = []
        for path, module, name, value in self._first:
            if name not in assigned or not isinstance(value, _STATE) or not _same(value, vars(module).get(name, _Gone)):
                continue
            if re.search(rf"\.{re.escape(name)}(?!\w)|\['{re.escape(name)}'\]", read):
                found.append(f"{path}.{name} (= {_shown(value)}, assigned in {assigned[name]})")
        return list(dict.fromkeys(found))


# The values a first call's state is checked for: flags, sizes, settings and tensors (a list or a dict
# the model rebuilds the same way in its __init__ guards the same in a fresh model).
_STATE = (bool, int, float, str, type(None), torch.Tensor)


class _Gone:
    pass


def _shown(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _assigned_names(traced: list[tuple[str, str]], classes: set) -> dict[str, str]:
    """{attribute name: where it is assigned} over the traced sources ((module, text) pairs), the
    methods of `classes` they call on an object (`self._rescale_layers()`) and the functions of their
    module they call by name (`install_all_output_capturing_hooks(model)`), one call deep."""
    assigned: dict[str, str] = {}
    callees: dict[str, types.FunctionType] = {}
    for module, text in traced:
        tree = _parsed(text)
        if tree is None or not _one_function(tree) or _builds_its_own_object(tree) or _torchs(module):
            continue  # a whole module's or class's text (Dynamo records what getsource gives) is not one call's
        called: set[str] = set()
        _collect(tree, assigned, called, f"{tree.body[0].name} in {module}")  # type: ignore[attr-defined]
        scope = vars(sys.modules[module]) if module in sys.modules else {}
        for name in called - _OWN_OBJECT_BUILDERS:
            found = [scope.get(name), *(getattr(cls, name, None) for cls in classes)]
            for function in found:
                if isinstance(function, types.FunctionType) and not _torchs(function.__module__):
                    callees.setdefault(f"{function.__module__}.{function.__qualname__}", function)
    for where, function in sorted(callees.items()):
        tree = _parsed(_source(function))
        if tree is not None:
            _collect(tree, assigned, set(), where)
    return assigned


# Methods that set up the object they are called on, not state of a model that existed before the
# call: a ModelOutput's __init__ Dynamo traces, a super().__init__() the traced code calls.
_OWN_OBJECT_BUILDERS = frozenset({"__init__", "__post_init__", "__new__", "__setattr__", "__setstate__"})


def _torchs(module: str) -> bool:
    """torch's own modules (an RNN rebuilding its flat weight list) keep state a fresh module has too."""
    return module == "torch" or module.startswith("torch.")


def _one_function(tree: ast.AST) -> bool:
    body = getattr(tree, "body", [])
    return len(body) == 1 and isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef))


def _builds_its_own_object(tree: ast.AST) -> bool:
    return tree.body[0].name in _OWN_OBJECT_BUILDERS  # type: ignore[attr-defined]


def _collect(tree: ast.AST, assigned: dict, called: set, where: str) -> None:
    for node in ast.walk(tree):
        # An attribute of a named object (`self.ready = ...`), not one deeper (`self.config.is_causal =
        # ...`, which transformers' wrapper sets and restores around every call).
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
            assigned.setdefault(node.attr, where)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2 and isinstance(node.args[0], ast.Name):
                key = node.args[1]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    assigned.setdefault(key.value, where)
            elif isinstance(func, ast.Attribute):
                called.add(func.attr)
            elif isinstance(func, ast.Name):
                called.add(func.id)


def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _parsed(text: str) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return None


def traced_sources(entry) -> list[tuple[str, str]]:
    """(module, text) of every function Dynamo traced for the package: the frames it compiled and the
    functions it inlined into them."""
    from precompile.torch_compat import SerializedCode

    texts = [(source.module, _lines(source)) for source in entry.source_info.inlined_sources]
    for code in entry.codes:
        texts.append((code.python_module, _source(SerializedCode.to_code_object(code.python_code))))
    return texts


def _lines(source) -> str:
    """An inlined function's text: its lines of the file text Dynamo recorded (torch 2.13 records the
    whole file), or the text itself where it holds only the function."""
    lines = source.content.splitlines(keepends=True)
    if len(lines) >= source.lastlineno - 1 > 0:
        return "".join(lines[source.firstlineno - 1:source.lastlineno - 1])
    return source.content
