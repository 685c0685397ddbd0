"""What reading one part of python_code finds, and the parts of the file read last, kept for the next.

python_code is parsed a part at a time (`chunked_parse`). Everything the reader takes from a part
(the opaque-state rule's findings and the literals holding pickles, the metadata literals, where the
rendered guards are and their syntax trees) is decided by the part's text alone, its lines counted
from the part's first. So the readings of the file read last are kept by each part's sha256, and a
file that shares parts with it (`diff` of two releases that differ in a few places, a pair and its
copy) reads only the parts that differ: a part is never parsed twice in one process. One file's
readings are kept at a time, and, as the reader keeps them, syntax trees of rendered guards only
within rendered_guards.KEPT_LINES.
"""
from __future__ import annotations

import ast
from typing import Any, NamedTuple

from precompile.artifact.pycode import NotALiteral, literal_assignments
from precompile.inspect.parsing import rendered_guards
from precompile.inspect.parsing.opaque import OpaquePart, read_part


class PartReading(NamedTuple):
    opaque: OpaquePart
    values: dict[str, Any]
    """The part's metadata literals (`literal_assignments`), a NotALiteral's line counted from the part's first."""
    guard_spans: tuple[tuple[int, int], ...]
    """(first, last) line of each top-level statement rendered_guards reads."""
    guards: tuple[ast.stmt, ...] | None
    """Those statements' syntax trees; None where they were not kept."""

    def values_at(self, before: int) -> dict[str, Any]:
        """`values` with each NotALiteral's line made the file's (`before`: the lines before the part)."""
        return {name: NotALiteral(value.lineno + before) if isinstance(value, NotALiteral) else value
                for name, value in self.values.items()}


def read(tree: ast.Module) -> PartReading:
    """The reading of one part's syntax tree: one walk for the opaque parts and the pickles, and the
    top-level statements for the metadata and the rendered guards."""
    guards = tuple(rendered_guards.read_statements(tree))
    return PartReading(read_part(tree), literal_assignments(tree),
                       tuple((node.lineno, node.end_lineno or node.lineno) for node in guards), guards)


_last: dict[str, PartReading | None] = {}


def last_file() -> dict[str, PartReading | None]:
    """The readings of the parts of the file read last, by sha256 of each part's text (None: the
    part does not parse alone; `chunked_parse.read_parts`)."""
    return _last


def remember(parts: dict[str, PartReading | None], *, trees: bool) -> None:
    """Keep `parts` (a file's readings) for the next file read, in place of the last; without the
    rendered guards' syntax trees unless `trees` (the reader kept them for its own file)."""
    global _last
    _last = parts if trees else {digest: part and part._replace(guards=None) for digest, part in parts.items()}
