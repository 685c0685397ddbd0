"""Whether a text a Mega-Cache entry holds is an expression torch itself would write where torch
evaluates one: read with `ast`, never evaluated.

torch evaluates two kinds of text from an Inductor or AOTAutograd cache entry, with `eval` and its
`SYMPY_INTERP` namespace (`math`, `torch` and two helpers) plus the builtins:

- a guard expression (`guards_expr` of `CompiledFxGraph` and the AOTAutograd results), evaluated
  when the entry is looked up, before anything else of it is used. `ShapeEnv.produce_guards_expression`
  writes it: each shape guard printed by `ShapeGuardPythonPrinter` over the graph's symbolic ints,
  named by their sources `L['t0']`, `L['t1']`, ..., joined by ` and ` (`2 <= L['t0'] and L['t0'] <= 4096`).
- an output stride (`output_strides`, a list of tuples of texts), evaluated at load with the shape
  environment's symbols by name (`s0`, `zf1`): `SymExprPrinter` writes it (`4`, `s0*s1`).

Both printers are torch's `PythonPrinter` (torch/utils/_sympy/printers.py, torch 2.11-2.14), which
writes numbers, `True`/`False`, the symbols, arithmetic (`+ - * / // % **`, `& | ^` for bitwise
functions, unary `-`), comparisons, `and`/`or`/`not`, `x if c else y` (Piecewise), and calls of
`abs`, `max`, `min`, `round`, `math.<floor|ceil|trunc|...>`, `torch.sym_float`, `torch._sym_sqrt`
and, as sympy's printer names them, `IsNonOverlappingAndDenseIndicator` and
`cast_symbool_to_symint_guardless`; `math.inf` and `math.nan` as values. Anything else (another
name, an attribute, a subscript other than `L['t<N>']`, a string, a lambda, a comprehension, a
keyword argument, a walrus) is refused, with what it is and where.
"""
from __future__ import annotations

import ast
import re

MAX_TEXT = 1 << 20
"""Characters of one expression read; a longer one is refused unread (torch writes one guard per
symbolic size, far under this)."""
_SOURCE = re.compile(r"t(?:0|[1-9][0-9]{0,5})")
_SYMBOL = re.compile(r"(?:s|zf)(?:0|[1-9][0-9]{0,8})")
_CALLS = frozenset({"abs", "max", "min", "round", "IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless"})
_MATH_CALLS = frozenset({"floor", "ceil", "trunc", "sqrt", "cos", "cosh", "acos", "sin", "sinh", "asin", "tan", "tanh",
                         "atan", "log2"})
_MATH_VALUES = frozenset({"inf", "nan"})
_TORCH_CALLS = frozenset({"sym_float", "_sym_sqrt"})
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr, ast.BitXor)
_UNARY = (ast.Not, ast.USub, ast.UAdd)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _attribute(node: ast.AST) -> tuple[str, str] | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id, node.attr
    return None


def _is_source(node: ast.AST) -> bool:
    """`L['t<N>']`: a graph input by the source name produce_guards_expression gives it."""
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "L"
            and isinstance(node.slice, ast.Constant) and type(node.slice.value) is str
            and _SOURCE.fullmatch(node.slice.value) is not None)


def _callee_allowed(func: ast.AST) -> bool:
    if isinstance(func, ast.Name):
        return func.id in _CALLS
    owner = _attribute(func)
    return owner is not None and (owner[0] == "math" and owner[1] in _MATH_CALLS or owner[0] == "torch" and owner[1] in _TORCH_CALLS)


def _where(node: ast.AST) -> str:
    return f"at column {getattr(node, 'col_offset', 0) + 1}"


def _operands(node: ast.AST) -> list[ast.expr] | None:
    """The operands of an operator torch's printer writes, in reading order; None for any other node."""
    if isinstance(node, ast.BoolOp):
        return node.values
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY):
        return [node.operand]
    if isinstance(node, ast.BinOp) and isinstance(node.op, _OPERATORS):
        return [node.left, node.right]
    if isinstance(node, ast.Compare) and all(isinstance(op, _COMPARISONS) for op in node.ops):
        return [node.left, *node.comparators]
    if isinstance(node, ast.IfExp):
        return [node.body, node.test, node.orelse]
    return None


def _call_refusal(node: ast.Call) -> str | None:
    allowed = _callee_allowed(node.func)
    if allowed and not node.keywords and not any(isinstance(arg, ast.Starred) for arg in node.args):
        return None
    return f"a call of {ast.unparse(node.func)[:80]} {_where(node)}" + ("" if not allowed else " with keyword or starred arguments")


def _leaf_refusal(node: ast.AST, symbols: str) -> str | None:
    if isinstance(node, ast.Constant):
        return None if type(node.value) in (int, float, bool) else f"a {type(node.value).__name__} constant {_where(node)}"
    if symbols == "sources" and _is_source(node) or symbols == "names" and isinstance(node, ast.Name) and _SYMBOL.fullmatch(node.id):
        return None
    if _attribute(node) in {("math", name) for name in _MATH_VALUES}:
        return None
    return f"{_describe(node)} {_where(node)}"


def _refusal_of(node: ast.AST, symbols: str) -> str | None:
    """Why the tree under `node` is not what torch's printer writes (its first node in reading order
    that is not), or None; walked without recursion."""
    stack: list[ast.AST] = [node]
    while stack:
        node = stack.pop()
        operands = _operands(node)
        if operands is None and isinstance(node, ast.Call):
            why = _call_refusal(node)
            if why is not None:
                return why
            operands = node.args
        why = _leaf_refusal(node, symbols) if operands is None else None
        if why is not None:
            return why
        stack.extend(reversed(operands or ()))
    return None


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id}"
    if isinstance(node, ast.Attribute):
        return f"the attribute {ast.unparse(node)[:80]}"
    if isinstance(node, ast.Subscript):
        return f"the subscript {ast.unparse(node)[:80]}"
    return f"a {type(node).__name__} expression"


def refusal(text: str, symbols: str) -> str | None:
    """Why `text` is not an expression torch would write (None when it is one): `symbols` is
    "sources" for a guard expression (`L['t0']`), "names" for an output stride (`s0`)."""
    if len(text) > MAX_TEXT:
        return f"{len(text)} characters, over the {MAX_TEXT} read"
    try:
        tree = ast.parse(text.lstrip(" \t"), mode="eval")  # eval strips leading blanks from a string
    except SyntaxError as exc:
        return f"not one Python expression ({exc.msg}" + (f", at column {exc.offset})" if exc.offset else ")")
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"not one Python expression ({type(exc).__name__})"
    try:
        return _refusal_of(tree.body, symbols)
    except RecursionError:  # ast.unparse of a deeply nested callee
        return "nested past what is read"
