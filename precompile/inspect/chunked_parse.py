"""Parse python_code a part at a time, so that no syntax tree of the whole file is ever held.

A syntax tree takes about 250 bytes of memory per byte of dense code: parsed whole, 100 MB of
python_code would need 25 GB. Top-level statements parse independently of each other, so the file
is cut, every CHUNK_CHARS or so, before a line that can only start one: at column 0, and not a
comment, a closing bracket or a clause that continues a statement (else, elif, except, finally). A
part that does not parse alone ends inside a construct (a bracket, a string, a decorator, a
backslash continuation) and is parsed again together with the next parts, twice as many each time;
a part that reaches the end of the file that way means the file does not parse, and the whole file
is parsed once for its error. A file with carriage returns is parsed whole (lines are counted on
newlines only). The cyclic garbage collector is paused while a part is parsed: a syntax tree holds no
cycles, and the collections its hundreds of thousands of new nodes trigger (each walking every tree
still held) took a third of the parse's time.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import NamedTuple

from precompile.artifact.pycode import cyclic_gc_paused, parse_source
from precompile.errors import PrecompileError

CHUNK_CHARS = 256 * 1024
_STATEMENT_START = re.compile(r"\n(?=(?!(?:else|elif|except|finally)\b)[^\s#)\]}])")


class Chunk(NamedTuple):
    tree: ast.Module
    first_line: int
    """The line of the file the part starts at: a node's line in the file is `lineno + first_line - 1`."""


def _cuts(source: str) -> list[int]:
    """Offsets the file may be cut at, about CHUNK_CHARS apart, from 0 to its length."""
    cuts = [0]
    for match in _STATEMENT_START.finditer(source):
        if match.end() - cuts[-1] >= CHUNK_CHARS:
            cuts.append(match.end())
    return [*cuts, len(source)] if cuts[-1] != len(source) else cuts


def parsed_chunks(source: str, *, filename: str) -> Iterator[Chunk]:
    """The syntax trees of the file's parts in file order; a PrecompileError when the file does not parse."""
    cuts = [0, len(source)] if "\r" in source else _cuts(source)
    start, line = 0, 1
    while start < len(cuts) - 1:
        span = 1
        while True:
            end = min(start + span, len(cuts) - 1)
            try:
                with cyclic_gc_paused():
                    tree = parse_source(source[cuts[start]:cuts[end]], filename=filename)
                break
            except PrecompileError:
                if end == len(cuts) - 1:
                    parse_source(source, filename=filename)  # raises the file's own error, with its line
                    raise PrecompileError(f"{filename} does not parse from line {line} on") from None
                span *= 2
        yield Chunk(tree, line)
        del tree
        line += source.count("\n", cuts[start], cuts[end])
        start = end
