"""Find the pickles python_code carries as literals and scan them, never unpickling them.

A Dynamo artifact ships its opaque state (guard trees, transformed bytecode) as a base64 string
that `load` decodes and unpickles: the one part of python_code a reviewer cannot read. Every str
literal that decodes (base64, standard or URL-safe, as leniently as `b64decode`) to a pickle, and
every bytes literal that is one, anywhere in the file, is scanned by `pickle_scan`, and named by its
section, the name it is assigned to and its line.
"""
from __future__ import annotations

import ast
import base64
import bisect
from collections.abc import Iterator
import binascii

from precompile.inspect.model import PickleImport, PickleScan, Section
from precompile.inspect.pickle_scan import MAX_PICKLE_SIZE, scan_pickle

MIN_BLOB_CHARS = 16


def _is_pickle_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and data[1] <= 5 and len(data) <= MAX_PICKLE_SIZE


def pickle_of(value) -> bytes | None:
    """The pickle a literal holds: bytes as they are; a str decoded as base64 the lenient way
    `b64decode` does by default (characters outside the alphabet are dropped), standard or URL-safe,
    or taken as latin-1 when it starts like a pickle itself."""
    if isinstance(value, bytes):
        return value if _is_pickle_header(value) else None
    if not isinstance(value, str) or len(value) < MIN_BLOB_CHARS:
        return None
    if value.startswith("\x80"):
        try:
            data = value.encode("latin-1")
        except UnicodeEncodeError:
            data = b""
        if _is_pickle_header(data):
            return data
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            data = decode(value)
        except (binascii.Error, ValueError):
            continue
        if _is_pickle_header(data):
            return data
    return None


def _section_of(line: int, sections: tuple[Section, ...], starts: list[int]) -> str:
    """The slug of the section holding `line`, by bisection of `starts` (each section's first line, in file order)."""
    index = bisect.bisect_right(starts, line) - 1
    if index >= 0 and line < sections[index].first_line + sections[index].line_count:
        return sections[index].slug
    return "header"


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of the tree, each before its children; expression contexts (Load, Store) skipped.

    `ast.walk` without its per-node generator and the contexts: a third less time on a big file."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                stack.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST) and name != "ctx":
                stack.append(value)


def scan_literal_pickles(tree: ast.Module, sections: tuple[Section, ...], *, first_line: int = 1) -> tuple[PickleScan, ...]:
    """Each pickle held by a str (base64) or bytes literal of a syntax tree of python_code (or of its
    part that starts at `first_line`), in file order."""
    targets: dict[int, str] = {}
    starts = [section.first_line for section in sections]
    found = []
    for node in _nodes(tree):  # an assignment comes before the literal it assigns
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(names) == 1 and isinstance(names[0], ast.Name):
                targets[id(node.value)] = names[0].id
            continue
        if not isinstance(node, ast.Constant):
            continue
        data = pickle_of(node.value)
        if data is None:
            continue
        where = targets.get(id(node), "a literal")
        line = node.lineno + first_line - 1
        member = f"python_code section {_section_of(line, sections, starts)}: {where} (line {line})"
        scan = scan_pickle(data, member=member)
        if scan.top_level is not None or scan.imports:  # a pickle, or enough of one to import something
            found.append((line, node.col_offset, scan))
    return tuple(scan for _, _, scan in sorted(found, key=lambda item: item[:2]))


def finding_text(scan: PickleScan, imp: PickleImport | None) -> str:
    """One finding of `Artifact.opaque_findings`: the section, the import and the opcode offset."""
    if imp is None:
        return f"{scan.member}: the pickle could not be scanned to its end ({scan.problem}), so what it would do is unknown"
    where = f", in the {imp.within}" if imp.within else ""
    why = imp.unresolved or "able to execute code, import, open files or unpickle"
    return (f"{scan.member} would import {imp.module}.{imp.name} at opcode offset {imp.offset} "
            f"({imp.opcode}{where}) if unpickled: {why}")
