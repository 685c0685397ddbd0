"""python_code's bytecode stored a part at a time, so that proving it takes the memory of a part.

Compiling python_code whole takes 37 to 150 bytes a byte of it (the compiler's syntax tree and symbol
table): 4.1 GB for 110 MB, past what verify's proof may take. So capture stores the bytecode of
python_code over WHOLE_MAX_CHARS as one module code object a part: a run of whole top-level
statements, about PART_CHARS long, cut where a line can only start a statement (as the reader cuts,
inspect/chunked_parse.py) and grown while it does not compile alone. Each part is compiled with the
lines before it as blank lines, so its line numbers are the file's, and with the `__future__`
features the first part turns on (the whole file's). Load executes the parts in turn in one
namespace, as the module's statements run one after another. The stored blob is
`marshal.dumps(((code, ...), modules), 2)`, its `part_lines` records the line each part starts at,
and its flags carry PARTS, which readers that predate this layout do not accept: they compile
python_code instead.

Executing the parts in turn is executing the module when the first part starts at line 1 and each
other at a later line within the file, each part compiles alone, and no part but the first names
`__doc__` or `__future__`: compiled alone, a part that begins with a string binds it to `__doc__` (a
docstring), and one that begins with a `from __future__` import compiles (in the file it is an
error). `part_lines_problem` and the compile (`compiled_parts`) check exactly that, at capture and in
verify's proof, which hashes the parts' marshalled code as it compiles them (marshal version 2
writes a tuple as its items' bytes one after another), so no more than a part is held at once.
"""
from __future__ import annotations
import __future__

import hashlib
import marshal
import re
import types
from collections.abc import Iterable, Iterator

PARTS = 1 << 30
"""The flag a blob stored a part at a time carries beside its compile() flags (no compile flag uses it)."""
WHOLE_MAX_CHARS = 1024 * 1024
"""python_code up to this long is compiled whole (the proof of it takes at most about 150 MB)."""
PART_CHARS = 1024 * 1024
MAX_PARTS = 4096
"""The most parts a blob may record: each is compiled after as many blank lines as precede it, so a
hostile blob of countless parts would make the proof's compiles scan the file's lines that often."""
MARSHAL_VERSION = 2
_STATEMENT_START = re.compile(r"\n(?=(?!(?:else|elif|except|finally)\b)[^\s#)\]}])")
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag
_NOT_AFTER_THE_FIRST = frozenset({"__doc__", "__future__"})


class NotInParts(ValueError):
    """A part but the first names `__doc__` or `__future__`: run alone it is not what it is in the file."""


def compiled_parts(source: str, filename: str, flags: int, optimize: int,
                   part_lines: tuple[int, ...]) -> Iterator[types.CodeType]:
    """Each part's code, in order, parts starting at `part_lines` (checked by part_lines_problem).
    Raises SyntaxError (or ValueError) where a part does not compile alone, and NotInParts where a
    part but the first names `__doc__` or `__future__`."""
    starts = _offsets(source, part_lines)
    future = 0
    for index, (start, end) in enumerate(zip(starts, [*starts[1:], len(source)])):
        code = _compiled(source, part_lines[index], start, end, filename, flags | future, optimize)
        if index == 0:
            future = code.co_flags & _FUTURE_FLAGS
        elif not _NOT_AFTER_THE_FIRST.isdisjoint(code.co_names):
            raise NotInParts(f"the part at line {part_lines[index]} names __doc__ or __future__, which it binds "
                             "or imports otherwise alone than within the file")
        yield code


def capture_parts(source: str, filename: str, flags: int, optimize: int) -> tuple[tuple[int, ...], list[types.CodeType]] | None:
    """The parts capture stores `source` in (the line each starts at, and its code): cut where a line
    can only start a statement, about PART_CHARS apart, each grown to the next cut while it does not
    compile alone. None where no such parts exist: a file with carriage returns (whose lines the
    compiler counts otherwise), a part but the first that names `__doc__` or `__future__`, a file
    that does not compile so."""
    if "\r" in source:
        return None
    cuts = _cuts(source)
    if len(cuts) - 1 > MAX_PARTS:
        return None
    lines: list[int] = []
    codes: list[types.CodeType] = []
    future, index = 0, 0
    while index < len(cuts) - 1:
        span = 1
        while True:
            end = min(index + span, len(cuts) - 1)
            try:
                code = _compiled(source, cuts[index][0], cuts[index][1], cuts[end][1], filename, flags | future, optimize)
                break
            except (SyntaxError, ValueError):
                if end == len(cuts) - 1:
                    return None
                span *= 2
        if index == 0:
            future = code.co_flags & _FUTURE_FLAGS
        elif not _NOT_AFTER_THE_FIRST.isdisjoint(code.co_names):
            return None
        lines.append(cuts[index][0])
        codes.append(code)
        index = end
    return tuple(lines), codes


def part_lines_problem(source: str, part_lines: tuple[int, ...]) -> str | None:
    """Why `part_lines` does not cut `source` into parts (the first at line 1, then increasing, within the file), or None."""
    if len(part_lines) > MAX_PARTS:
        return f"it records {len(part_lines)} parts; capture writes at most {MAX_PARTS}"
    if not part_lines or part_lines[0] != 1:
        return f"its parts start at lines {_shown(part_lines)}: the first must start at line 1"
    if any(later <= earlier for earlier, later in zip(part_lines, part_lines[1:])):
        return f"its parts start at lines {_shown(part_lines)}, not increasing"
    lines = source.count("\n") + 1
    if part_lines[-1] > lines:
        return f"its last part starts at line {part_lines[-1]}, past python_code's {lines} lines"
    if "\r" in source:
        return "python_code holds carriage returns, whose lines the compiler counts otherwise, so it is not stored in parts"
    return None


def digest_of(codes: Iterable[types.CodeType], count: int, modules: dict[str, types.CodeType]) -> bytes:
    """sha256 of marshal.dumps((tuple(codes), modules), 2), each code marshalled and let go in turn."""
    digest = hashlib.sha256(_tuple_head(2) + _tuple_head(count))
    for code in codes:
        digest.update(marshal.dumps(code, MARSHAL_VERSION))
    digest.update(marshal.dumps(modules, MARSHAL_VERSION))
    return digest.digest()


def _tuple_head(count: int) -> bytes:
    return b"(" + count.to_bytes(4, "little", signed=True)


def _compiled(source: str, line: int, start: int, end: int, filename: str, flags: int, optimize: int) -> types.CodeType:
    """The part of `source` from offset `start` to `end` (starting at `line`), compiled at its lines."""
    return compile("\n" * (line - 1) + source[start:end], filename, "exec", flags=flags, dont_inherit=True, optimize=optimize)


def _cuts(source: str) -> list[tuple[int, int]]:
    """(line, offset) where a part may start, about PART_CHARS apart, then (lines + 1, len(source))."""
    cuts, line, offset = [(1, 0)], 1, 0
    for match in _STATEMENT_START.finditer(source):
        if match.end() - offset >= PART_CHARS:
            line += source.count("\n", offset, match.end())
            offset = match.end()
            cuts.append((line, offset))
    return [*cuts, (line + source.count("\n", offset) + 1, len(source))]


def _offsets(source: str, part_lines: tuple[int, ...]) -> list[int]:
    """The offset each of `part_lines` (increasing) starts at, found a block of text at a time."""
    offsets, line, offset = [], 1, 0
    for wanted in part_lines:
        while line < wanted:
            block = min(len(source), offset + 65536)
            newlines = source.count("\n", offset, block)
            if newlines < wanted - line and block < len(source):
                line, offset = line + newlines, block
            else:
                offset = source.index("\n", offset) + 1
                line += 1
        offsets.append(offset)
    return offsets


def _shown(part_lines: tuple[int, ...]) -> str:
    return ", ".join(map(str, part_lines[:6])) + (", ..." if len(part_lines) > 6 else "")
