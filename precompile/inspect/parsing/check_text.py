"""What ast.unparse writes for the shapes a rendered guard check takes, without its visitor.

A guard function checks one condition an `if`, nearly always a comparison or a call over access
paths and literals: `len(s12._forward_hooks) == 0`, `s8['bias'] is None`,
`___check_obj_id(s3, 140...)`. ast.unparse writes those through a visitor of a dozen calls a node
(a third of reading densenet121's 6,600 checks); `written` writes them in one pass, each local
bound to a path written as its path, exactly as the unparser does, and gives None for anything
else (any other node, a literal unparse would quote or escape another way, a comparison or call
nested where unparse might add parentheses), which the unparser then writes.
"""
from __future__ import annotations

import ast

_OPERATORS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
}
_QUOTES_AND_ESCAPES = frozenset("'\"\\")


class Unwritten(Exception):
    """The node is not of the shapes `written` writes."""


class TooLong(Exception):
    """The paths written would pass the most characters allowed."""


def written(test: ast.AST, paths: dict[str, str], most: int) -> tuple[str, list[str]]:
    """`test` as ast.unparse writes it with each name in `paths` written as its path, and the names
    written so, in order. Raises Unwritten for a node outside those shapes, TooLong once the paths
    written pass `most` characters (a hostile file could name a long path any number of times)."""
    writer = _Writer(paths, most)
    if isinstance(test, ast.Compare):
        parts = [writer.operand(test.left)]
        for op, right in zip(test.ops, test.comparators):
            parts.append(_OPERATORS[type(op)])
            parts.append(writer.operand(right))
        return " ".join(parts), writer.used
    return writer.operand(test), writer.used


class _Writer:
    def __init__(self, paths: dict[str, str], most: int) -> None:
        self.paths, self.left = paths, most
        self.used: list[str] = []

    def operand(self, node: ast.AST) -> str:
        return _literal(node.value) if isinstance(node, ast.Constant) else self.primary(node)

    def primary(self, node: ast.AST) -> str:
        """A name, attribute, subscript or call: what unparse writes with no parentheses around it."""
        if isinstance(node, ast.Name):
            path = self.paths.get(node.id)
            if path is None:
                return node.id
            self.left -= len(path)
            if self.left < 0:
                raise TooLong
            self.used.append(node.id)
            return path
        if isinstance(node, ast.Attribute):
            return f"{self.primary(node.value)}.{node.attr}"
        # Each part is written in the order it is read, as the unparser writes it, so the names come
        # out in that order too: a subscript's value before its key, a call's callee before its arguments.
        if isinstance(node, ast.Subscript):
            value = self.primary(node.value)
            return f"{value}[{self.operand(node.slice)}]"
        if isinstance(node, ast.Call) and not node.keywords:
            callee = self.primary(node.func)
            arguments = ", ".join(self.operand(argument) for argument in node.args)
            return f"{callee}({arguments})"
        raise Unwritten


def _literal(value: object) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int) and 0 <= value < 10**15:  # as parsed (no sign), far from str()'s digit limit
        return repr(value)
    if isinstance(value, str) and value.isprintable() and _QUOTES_AND_ESCAPES.isdisjoint(value):
        return f"'{value}'"
    raise Unwritten
