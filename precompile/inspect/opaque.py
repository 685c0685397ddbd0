"""Find the pickles python_code carries as literals and scan them, never unpickling them.

A Dynamo artifact ships its opaque state (guard trees, transformed bytecode) as a base64 string
that `load` decodes and unpickles: the one part of python_code a reviewer cannot read. It is found
by the rule load itself uses (`schema.opaque_state.find_parts`: one top-level `_dynamo_state = <str literal>`,
any other spelling is a problem) and always scanned. Besides it, every str literal that decodes
(base64, standard or URL-safe, as leniently as `b64decode`) to a pickle, and every str or bytes
literal that is one, anywhere in the file, is scanned by `pickle_scan`, and named by its section,
the name it is assigned to and its line.
"""
from __future__ import annotations

import ast
import base64
import binascii
import sys

from precompile.artifact.opaque_state import REMEDY, STATE, blob_problem, bytecode_blobs, decode, find_parts
from precompile.artifact.pycode import literal_assignments
from precompile.inspect.model import PickleImport, PickleScan, Section
from precompile.inspect.pickle_scan import MAX_PICKLE_SIZE, dynamo_state_reviewed, is_pickle, scan_pickle

MIN_BLOB_CHARS = 16


def _is_pickle_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and data[1] <= 5 and len(data) <= MAX_PICKLE_SIZE


def _pickle_of(value) -> bytes | None:
    """The pickle a literal holds: bytes that are one (any protocol, `is_pickle`); a str that is one
    taken as latin-1; or a str decoded as base64 the lenient way `b64decode` does by default
    (characters outside the alphabet are dropped), standard or URL-safe, to a protocol 2-5 pickle."""
    if isinstance(value, bytes):
        return value if is_pickle(value) else None
    if not isinstance(value, str) or len(value) < MIN_BLOB_CHARS:
        return None
    try:
        data = value.encode("latin-1")
    except UnicodeEncodeError:
        data = b""
    if is_pickle(data):
        return data
    for b64decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            data = b64decode(value)
        except (binascii.Error, ValueError):
            continue
        if _is_pickle_header(data):
            return data
    return None


def _section_of(line: int, sections: tuple[Section, ...]) -> str:
    for section in sections:
        if section.first_line <= line < section.first_line + section.line_count:
            return section.slug
    return "header"


def read_opaque(source: str, sections: tuple[Section, ...]) -> tuple[tuple[PickleScan, ...], tuple[str, ...]]:
    """The pickles python_code carries, in file order: the opaque state `load` unpickles (always
    scanned, found by the rule load uses, `opaque_state.find_parts`) and any other str or bytes
    literal holding one; and the problems that keep the opaque parts from being read as load reads
    them (a spelling other than the canonical one, bytecode that does not match its label).
    ((), ()) when the file does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return (), ()
    state, bytecode = find_parts(tree)
    problems = [found.problem for found in (state, bytecode) if found.problem is not None]
    if bytecode.assignment is not None:
        blobs = bytecode_blobs(bytecode.assignment, source.splitlines())
        problems.extend(problem for problem in map(blob_problem, blobs) if problem is not None)
    found = []
    state_value = state.assignment.value if state.assignment is not None else None
    if isinstance(state_value, ast.Constant) and state_value.value:
        scan, problem = _state_scan(state_value, sections, tree)
        problems.extend([problem] if problem is not None else [])
        found.extend([(state_value.lineno, state_value.col_offset, scan)] if scan is not None else [])
    found.extend(_literal_scans(tree, sections, skip=state_value))
    scans = tuple(scan for _, _, scan in sorted(found, key=lambda item: item[:2]))
    return scans, tuple(problems)


def _state_scan(value: ast.Constant, sections: tuple[Section, ...], tree: ast.Module) -> tuple[PickleScan | None, str | None]:
    """The scan of the pickle load would unpickle from `_dynamo_state`, whatever it holds, or why there
    is none; strict: an import neither data-only nor reviewed for Dynamo's state is a finding."""
    try:
        data = decode(value.value)
    except ValueError as exc:
        return None, f"{STATE} (line {value.lineno}) is {exc}: load refuses it, and it cannot be scanned; {REMEDY}"
    member = f"python_code section {_section_of(value.lineno, sections)}: {STATE} (line {value.lineno})"
    return scan_pickle(data, member=member, reviewed=dynamo_state_reviewed(_captured_modules(tree))), None


def _captured_modules(tree: ast.Module) -> frozenset[str]:
    """The modules whose code the artifact captured (FN_MODULE, FRAMES, INLINED_SOURCES), the standard library excepted."""
    values = literal_assignments(tree)
    listed = [values.get("FN_MODULE")] + [entry.get("module") for name in ("FRAMES", "INLINED_SOURCES")
                                          for entry in _dicts(values.get(name))]
    return frozenset(module for module in listed
                     if isinstance(module, str) and module.split(".")[0] not in sys.stdlib_module_names)


def _dicts(value) -> list[dict]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, (list, tuple)) else []


def _literal_scans(tree: ast.Module, sections: tuple[Section, ...], skip: ast.AST | None) -> list[tuple[int, int, PickleScan]]:
    """Each other literal holding a pickle (load does not unpickle them; they are listed for a reviewer)."""
    targets: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(names) == 1 and isinstance(names[0], ast.Name):
                targets[id(node.value)] = names[0].id
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or node is skip:
            continue
        data = _pickle_of(node.value)
        if data is None:
            continue
        where = targets.get(id(node), "a literal")
        member = f"python_code section {_section_of(node.lineno, sections)}: {where} (line {node.lineno})"
        scan = scan_pickle(data, member=member)
        if scan.top_level is not None or scan.imports:  # a pickle, or enough of one to import something
            found.append((node.lineno, node.col_offset, scan))
    return found


def finding_text(scan: PickleScan, imp: PickleImport | None) -> str:
    """One finding of `Artifact.opaque_findings`: the section, the import and the opcode offset."""
    if imp is None:
        return f"{scan.member}: the pickle could not be scanned to its end ({scan.problem}), so what it would do is unknown"
    where = f", in the {imp.within}" if imp.within else ""
    why = imp.unresolved or (
        "able to execute code, import, open files or unpickle" if imp.risk == "dangerous" else
        "neither on the data-only list nor reviewed as part of Dynamo's state, and load unpickles this state")
    return (f"{scan.member} would import {imp.module}.{imp.name} at opcode offset {imp.offset} "
            f"({imp.opcode}{where}) if unpickled: {why}")
