"""Find the pickles python_code carries as literals and scan them, never unpickling them.

A Dynamo artifact ships its opaque state (guard trees, transformed bytecode) as a base64 string
that `load` decodes and unpickles: the one part of python_code a reviewer cannot read. Every str
literal that is strict base64 of a pickle, and every bytes literal that is a pickle, anywhere in the
file, is scanned by `pickle_scan`, and named by its section, the name it is assigned to and its line.
"""
from __future__ import annotations

import ast
import base64
import binascii
import re

from precompile.inspect.model import PickleImport, PickleScan, Section
from precompile.inspect.pickle_scan import MAX_PICKLE_SIZE, scan_pickle

MIN_BLOB_CHARS = 16
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


def _pickle_of(value) -> bytes | None:
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str) and len(value) >= MIN_BLOB_CHARS and len(value) % 4 == 0 and _BASE64.match(value):
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
    else:
        return None
    if len(data) < 2 or data[0] != 0x80 or data[1] > 5 or len(data) > MAX_PICKLE_SIZE:
        return None
    return data


def _section_of(line: int, sections: tuple[Section, ...]) -> str:
    for section in sections:
        if section.first_line <= line < section.first_line + section.line_count:
            return section.slug
    return "header"


def scan_literal_pickles(source: str, sections: tuple[Section, ...]) -> tuple[PickleScan, ...]:
    """Each pickle held by a str (base64) or bytes literal, in file order; () when the file does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    targets: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(names) == 1 and isinstance(names[0], ast.Name):
                targets[id(node.value)] = names[0].id
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant):
            continue
        data = _pickle_of(node.value)
        if data is None:
            continue
        where = targets.get(id(node), "a literal")
        member = f"python_code section {_section_of(node.lineno, sections)}: {where} (line {node.lineno})"
        found.append((node.lineno, node.col_offset, scan_pickle(data, member=member)))
    return tuple(scan for _, _, scan in sorted(found, key=lambda item: item[:2]))


def finding_text(scan: PickleScan, imp: PickleImport | None) -> str:
    """One finding of `Artifact.opaque_findings`: the section, the import and the opcode offset."""
    if imp is None:
        return f"{scan.member}: the pickle could not be scanned to its end ({scan.problem}), so what it would do is unknown"
    where = f", in the {imp.within}" if imp.within else ""
    why = imp.unresolved or "able to execute code, import, open files or unpickle"
    return (f"{scan.member} would import {imp.module}.{imp.name} at opcode offset {imp.offset} "
            f"({imp.opcode}{where}) if unpickled: {why}")
