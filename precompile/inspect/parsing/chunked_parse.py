"""Parse python_code a part at a time, so that no syntax tree of the whole file is ever held.

A syntax tree takes about 250 bytes of memory per byte of dense code: parsed whole, 100 MB of
python_code would need 25 GB. Top-level statements parse independently of each other, so the file
is cut, every CHUNK_CHARS or so, before a line that can only start one: at column 0, and not a
comment, a closing bracket or a clause that continues a statement (else, elif, except, finally). A
part that does not parse alone ends inside a construct (a bracket, a string, a decorator, a
backslash continuation) and is parsed again together with the next parts, twice as many each time;
a part that reaches the end of the file that way means the file does not parse, and the whole file
is parsed once for its error. A file with carriage returns is parsed whole (lines are counted on
newlines only). The cyclic garbage collector is paused while a part is parsed and read: a syntax
tree holds no cycles, and the collections its hundreds of thousands of new nodes trigger (each
walking every tree still held) took a third of the parse's time. Parts can be told by the sha256
of their text (`read_parts`), so that a reader meeting a part it read before (in another file) does
not parse it again; the cuts fall where statements start, so two files that differ in one place
are cut alike on either side of it (in code of one short statement per line, after a change of
length, they may be cut alike again only much later).
"""
from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import NamedTuple, TypeVar

from precompile.artifact.code_parts import STATEMENT_START
from precompile.artifact.pycode import cyclic_gc_paused, parse_source
from precompile.errors import PrecompileError

CHUNK_CHARS = 256 * 1024
T = TypeVar("T")


class Chunk(NamedTuple):
    tree: ast.Module
    first_line: int
    """The line of the file the part starts at: a node's line in the file is `lineno + first_line - 1`."""


def _cuts(source: str) -> list[int]:
    """Offsets the file may be cut at, about CHUNK_CHARS apart, from 0 to its length."""
    cuts = [0]
    for match in STATEMENT_START.finditer(source):
        if match.end() - cuts[-1] >= CHUNK_CHARS:
            cuts.append(match.end())
    return [*cuts, len(source)] if cuts[-1] != len(source) else cuts


def parsed_chunks(source: str, *, filename: str) -> Iterator[Chunk]:
    """The syntax trees of the file's parts in file order; a PrecompileError when the file does not parse."""
    for tree, first_line in read_parts(source, filename=filename, read=lambda tree: tree):
        yield Chunk(tree, first_line)
        del tree


def read_parts(source: str, *, filename: str, read: Callable[[ast.Module], T],
               known: MutableMapping[str, T | None] | None = None) -> Iterator[tuple[T, int]]:
    """(reading, the line of the file it starts at) of each part in file order: `read` of the part's
    syntax tree (never None; the collector paused while it is parsed and read). With `known`, parts
    are told by the sha256 of their text: a part `known` maps to a reading is not parsed again (a
    reading holds what its text alone decides, its lines counted from the part's first), one it maps
    to None is known not to parse alone, and every part met is entered there. A PrecompileError
    when the file does not parse."""
    cuts = [0, len(source)] if "\r" in source else _cuts(source)
    start, line = 0, 1
    while start < len(cuts) - 1:
        span = 1
        while True:
            end = min(start + span, len(cuts) - 1)
            text = source[cuts[start]:cuts[end]]
            if known is None:
                reading = _read(text, filename, read)
            else:
                digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
                reading = known[digest] if digest in known else _read(text, filename, read)
                known[digest] = reading
            del text
            if reading is not None:
                break
            if end == len(cuts) - 1:
                parse_source(source, filename=filename)  # raises the file's own error, with its line
                raise PrecompileError(f"{filename} does not parse from line {line} on")
            span *= 2
        yield reading, line
        del reading
        line += source.count("\n", cuts[start], cuts[end])
        start = end


def _read(text: str, filename: str, read: Callable[[ast.Module], T]) -> T | None:
    """`read` of the syntax tree of `text`, None when it does not parse alone (it ends inside a construct)."""
    with cyclic_gc_paused():
        try:
            tree = parse_source(text, filename=filename)
        except PrecompileError:
            return None
        return read(tree)
