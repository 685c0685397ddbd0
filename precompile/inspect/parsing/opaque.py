"""Find the pickles python_code carries as literals and scan them, never unpickling them.

A Dynamo artifact ships its opaque state (guard trees, transformed bytecode) as a base64 string
that `load` decodes and unpickles: the one part of python_code a reviewer cannot read. It is found
by the rule load itself uses (`artifact.opaque_state`: one top-level `_dynamo_state = <str literal>`,
the name bound nowhere else; any other spelling is a problem) and always scanned, strictly. Besides
it, every str literal that decodes (base64, standard or URL-safe, as leniently as `b64decode`) to a
pickle, and every str or bytes literal that is one, anywhere in the file, is scanned by `pickle_scan`,
and named by its section, the name it is assigned to and its line.

python_code is read a part at a time (`chunked_parse`): `read_part` finds what one part's syntax
tree holds, with lines counted from the part's first (so that a part two files share is read once),
and `OpaqueReader` takes each part's reading in turn, decides what is canonical once it has seen
them all, and scans the pickles then.
"""
from __future__ import annotations

import ast
import base64
import binascii
import bisect
import re
from typing import NamedTuple

from precompile.artifact.opaque_state import (
    BYTECODE,
    REMEDY,
    STATE,
    blob_problem,
    bytecode_blobs,
    decode,
    is_canonical_value,
    mentions,
    not_canonical,
)
from precompile.artifact.pickle_policy import captured_modules, dynamo_state_reviewed
from precompile.artifact.pickle_scan import MAX_PICKLE_SIZE, is_pickle, scan_pickle
from precompile.inspect.model.artifact import PickleScan, Section

MIN_BLOB_CHARS = 16
_PICKLE_BASE64 = re.compile(r"[^A-Za-z0-9+/]*g|[^A-Za-z0-9+/_-]*g")
"""A str whose first base64 character, standard or URL-safe (`b64decode` drops any other), is `g`:
the only ones that can decode to bytes starting 0x80, as a protocol 2-5 pickle does."""


def _is_pickle_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and data[1] <= 5 and len(data) <= MAX_PICKLE_SIZE


def pickle_of(value) -> bytes | None:
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
    if not _PICKLE_BASE64.match(value):  # the first byte would not be a pickle's 0x80: not decoded at all
        return None
    for b64decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            data = b64decode(value)
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


class OpaquePart(NamedTuple):
    """What one part of python_code holds for the opaque-state rule and the pickle scan, found by
    one walk of its syntax tree; lines are counted from the part's first."""

    mentions: dict[str, list[int]]
    """Each name's bindings and string spellings, by line."""
    candidates: dict[str, list[ast.Assign]]
    """Each name's top-level `name = value` statements."""
    pickles: list[tuple[int, int, str | None, bytes]]
    """(line, column, the name it is assigned to alone or None, the pickle) of each str or bytes literal holding one."""


def read_part(tree: ast.Module) -> OpaquePart:
    """The OpaquePart of one part's syntax tree (its statements are kept, never changed)."""
    literals: list[tuple[ast.Constant, str | None]] = []
    found = mentions(tree, (STATE, BYTECODE), literals)
    pickles = []
    for node, target in literals:
        data = pickle_of(node.value)
        if data is not None:
            pickles.append((node.lineno, node.col_offset, target, data))
    candidates: dict[str, list[ast.Assign]] = {}
    for name, mentioned in found.items():
        targets = {id(node) for node in mentioned}
        candidates[name] = [statement for statement in tree.body if isinstance(statement, ast.Assign)
                            and len(statement.targets) == 1 and id(statement.targets[0]) in targets]
    return OpaquePart({name: [getattr(node, "lineno", 0) for node in mentioned] for name, mentioned in found.items()},
                      candidates, pickles)


class OpaqueReader:
    """The pickles of python_code and the problems of its opaque parts, read one part at a time."""

    def __init__(self, source: str, sections: tuple[Section, ...]) -> None:
        self._source = source
        self._sections = sections
        self._starts = [section.first_line for section in sections]
        self._mentions: dict[str, list[int]] = {STATE: [], BYTECODE: []}
        """Each name's bindings and string spellings, by line in the file."""
        self._candidates: dict[str, list[tuple[ast.Assign, int]]] = {STATE: [], BYTECODE: []}
        """Top-level `name = value` statements, each with the number of lines before its part."""
        self._pickles: list[tuple[int, int, str | None, bytes]] = []
        """The literals holding a pickle, at their lines in the file."""

    def add(self, part: OpaquePart, first_line: int = 1) -> None:
        """Take the reading of the part of python_code that starts at `first_line`."""
        before = first_line - 1
        for name, lines in part.mentions.items():
            self._mentions[name].extend(line + before for line in lines)
        for name, statements in part.candidates.items():
            self._candidates[name].extend((statement, before) for statement in statements)
        self._pickles.extend((line + before, column, target, data) for line, column, target, data in part.pickles)

    def finish(self, values: dict) -> tuple[tuple[PickleScan, ...], tuple[str, ...]]:
        """The pickles in file order (the opaque state scanned strictly when canonical) and the
        problems that keep the opaque parts from being read as load reads them. `values`: the
        file's metadata literals (which modules the artifact captured)."""
        problems: list[str] = []
        state = self._canonical(STATE)
        bytecode = self._canonical(BYTECODE)
        problems.extend(problem for problem in (state, bytecode) if isinstance(problem, str))
        if isinstance(bytecode, tuple):
            blobs = bytecode_blobs(bytecode[0], self._source.splitlines(), before=bytecode[1])
            problems.extend(problem for problem in map(blob_problem, blobs) if problem is not None)
        value, before = (state[0].value, state[1]) if isinstance(state, tuple) else (None, 0)
        at = (value.lineno + before, value.col_offset) if value is not None else None
        found: list[tuple[int, int, PickleScan]] = []
        for line, column, target, data in self._pickles:
            if (line, column) == at:
                continue  # the opaque state: scanned strictly below
            member = f"python_code section {_section_of(line, self._sections, self._starts)}: {target or 'a literal'} (line {line})"
            scan = scan_pickle(data, member=member)
            if scan.top_level is not None or scan.imports:  # a pickle, or enough of one to import something
                found.append((line, column, scan))
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value and at is not None:
            state_scan, state_problem = self._state_scan(value.value, at[0], values)
            problems.extend([state_problem] if state_problem is not None else [])
            found.extend([(*at, state_scan)] if state_scan is not None else [])
        return tuple(scan for _, _, scan in sorted(found, key=lambda item: item[:2])), tuple(problems)

    def _canonical(self, name: str) -> tuple[ast.Assign, int] | str | None:
        """The name's one canonical assignment (with the number of lines before its part), None when
        it is absent, or the problem."""
        lines = self._mentions[name]
        if not lines:
            return None
        candidates = self._candidates[name]
        if len(lines) == 1 and len(candidates) == 1 and is_canonical_value(name, candidates[0][0].value):
            return candidates[0]
        return not_canonical(name, lines)

    def _state_scan(self, text: str, line: int, values: dict) -> tuple[PickleScan | None, str | None]:
        """The scan of the pickle load would unpickle from `_dynamo_state` (`text`, at `line`), or why
        there is none; strict: an import neither data-only nor reviewed for Dynamo's state is a finding."""
        try:
            data = decode(text)
        except ValueError as exc:
            return None, f"{STATE} (line {line}) is {exc}: load refuses it, and it cannot be scanned; {REMEDY}"
        member = f"python_code section {_section_of(line, self._sections, self._starts)}: {STATE} (line {line})"
        return scan_pickle(data, member=member, reviewed=dynamo_state_reviewed(captured_modules(values))), None
