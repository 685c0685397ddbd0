"""python_code's bytecode stored a part at a time, so that proving it takes the memory of a part.

Compiling python_code whole takes 37 to 150 bytes a byte of it (the compiler's syntax tree and symbol
table): 4.1 GB for 110 MB, past what verify's proof may take. So capture stores the bytecode of
python_code over WHOLE_MAX_CHARS as one module code object a part: a run of whole top-level
statements, about PART_CHARS long, cut where a line can only start a statement (as the reader cuts,
inspect/parsing/chunked_parse.py) and grown while it does not compile alone. Each part is compiled with the
lines before it as blank lines, so its line numbers are the file's, and with capture's compile flags
(`from __future__ import annotations`, which the whole file is compiled with too; no other feature
changes how Python 3.11+ compiles, but barry_as_FLUFL, which is refused). Load executes the parts in turn in one
namespace, as the module's statements run one after another. The stored blob is
`marshal.dumps(((code, ...), modules), 2)`, its `part_lines` records the line each part starts at,
and its flags carry PARTS, which readers that predate this layout do not accept: they compile
python_code instead.

Executing the parts in turn runs the module's statements as the module runs them when the first
part starts at line 1 and each other at a later line within the file, each part compiles alone, and
no part but the first does what a module does once, for its whole body, or what a frame fixes when
it starts (found by the hostile review of this layout): names `__doc__` (a leading string would be
bound as a docstring), `__future__` (a future import compiles alone, not in the file) or
`__builtins__` (each part's frame takes its builtins when it starts; the module's frame, once), or
declares a name `global` at module level (the module's symbol table refuses a name bound or used
before that, which a part alone cannot see); nor may the first part name `__builtins__` or turn on
`barry_as_FLUFL` (a parser flag the later parts would be compiled with). `capture_parts` stores
python_code whole where one of those holds, and verify's proof (`compiled_parts`, after
`part_lines_problem`) refuses such parts. A module that annotates a name anywhere sets
`__annotations__` up before its first statement, a part only before its own: so where any part
does (`sets_up_annotations`), load sets it up before the first part runs, as the module would.
What remains different is what a frame or a code object is, not what the statements compute: each
part runs in a frame of its own (`sys._getframe()` differs between parts), with constants of its
own (`is` between equal literals of two parts); and a `__builtins__` rebound under a name computed
at run time reaches the later parts, and a deleted `__annotations__` is set up again by the next
part that annotates a name, where the module would raise NameError.
The proof hashes the parts' marshalled code as it compiles them (marshal version 2 writes a tuple
as its items' bytes one after another), so no more than a part is held at once.
"""
from __future__ import annotations
import __future__

import ast
import hashlib
import itertools
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
STATEMENT_START = re.compile(r"\n(?=(?!(?:else|elif|except|finally)\b)[^\s#)\]}])")
_NOT_AFTER_THE_FIRST = frozenset({"__doc__", "__future__", "__builtins__"})
_BARRY = __future__.barry_as_FLUFL.compiler_flag
_GLOBAL_LINE = re.compile(r"^[ \t]*global\b", re.MULTILINE)


class NotInParts(ValueError):
    """A part that would run otherwise alone than within the file (see the module's docstring)."""


def compiled_parts(source: str, filename: str, flags: int, optimize: int,
                   part_lines: tuple[int, ...]) -> Iterator[types.CodeType]:
    """Each part's code, in order, parts starting at `part_lines` (checked by part_lines_problem).
    Raises NotInParts where a part does not compile alone or would run otherwise alone than within
    the file (see the module's docstring), ValueError for text compile() refuses."""
    starts = _offsets(source, part_lines)
    for index, (start, end) in enumerate(zip(starts, [*starts[1:], len(source)])):
        try:
            code = _compiled(source, part_lines[index], start, end, filename, flags, optimize)
        except SyntaxError as exc:  # python_code compiles, or the reader said so: the cut is what is wrong
            raise NotInParts(f"the part at line {part_lines[index]} does not compile alone ({exc.msg}, line {exc.lineno})") from None
        problem = _alone_problem(code, index, len(part_lines), source[start:end])
        if problem is not None:
            raise NotInParts(f"the part at line {part_lines[index]} {problem}")
        yield code


def _alone_problem(code: types.CodeType, index: int, count: int, text: str) -> str | None:
    """What part `index` of `count` (its `code`, compiled from `text`) does that it would do otherwise
    alone than within the file, or None (see the module's docstring)."""
    if index == 0:
        if count > 1 and "__builtins__" in code.co_names:
            return "names __builtins__, which the later parts' frames would take otherwise than the module's frame"
        if code.co_flags & _BARRY:
            return "turns on barry_as_FLUFL, a parser flag the later parts would be compiled with"
        return None
    named = sorted(_NOT_AFTER_THE_FIRST.intersection(code.co_names))
    if named:
        return f"names {', '.join(named)}, which it would bind, import or read otherwise alone than within the file"
    if _GLOBAL_LINE.search(text) and _declares_global(text):
        return "declares a name global at module level, which the module's symbol table checks against the whole file"
    return None


def sets_up_annotations(codes: Iterable[types.CodeType]) -> bool:
    """Whether any of the parts sets `__annotations__` up (the compiler does so first thing in a
    module, or a part, that annotates a name at module level): load then sets it up before the first
    part runs, as the module would before its first statement."""
    import dis  # only where a python_code stored in parts is loaded: not on every load's import

    setup = dis.opmap["SETUP_ANNOTATIONS"]
    return any(op.opcode == setup for code in codes for op in itertools.islice(dis.get_instructions(code), 4))


def _declares_global(text: str) -> bool:
    """Whether `text` (a part, which compiles alone) has a `global` statement outside any function or class."""
    todo: list[ast.AST] = list(ast.parse(text).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Global):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.expr)):
            todo.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case))
    return False


def capture_parts(source: str, filename: str, flags: int, optimize: int) -> tuple[tuple[int, ...], list[types.CodeType]] | None:
    """The parts capture stores `source` in (the line each starts at, and its code): cut where a line
    can only start a statement, about PART_CHARS apart, each grown to the next cut while it does not
    compile alone. None where no such parts exist: a file with carriage returns (whose lines the
    compiler counts otherwise), a part that would run otherwise alone than within the file (see the
    module's docstring), a file that does not compile so."""
    if "\r" in source:
        return None
    cuts = _cuts(source)
    if len(cuts) - 1 > MAX_PARTS:
        return None
    lines: list[int] = []
    codes: list[types.CodeType] = []
    index = 0
    while index < len(cuts) - 1:
        span = 1
        while True:
            end = min(index + span, len(cuts) - 1)
            try:
                code = _compiled(source, cuts[index][0], cuts[index][1], cuts[end][1], filename, flags, optimize)
                break
            except (SyntaxError, ValueError):
                if end == len(cuts) - 1:
                    return None
                span *= 2
        if _alone_problem(code, len(lines), len(cuts) - 1, source[cuts[index][1]:cuts[end][1]]) is not None:
            return None
        lines.append(cuts[index][0])
        codes.append(code)
        index = end
    return tuple(lines), codes


def shape_problem(part_lines: tuple[int, ...]) -> str | None:
    """Why `part_lines` cuts no file into parts (the first at line 1, then increasing, at most MAX_PARTS), or None:
    what load checks too, without python_code's text."""
    if len(part_lines) > MAX_PARTS:
        return f"it records {len(part_lines)} parts; capture writes at most {MAX_PARTS}"
    if not part_lines or part_lines[0] != 1:
        return f"its parts start at lines {_shown(part_lines)}: the first must start at line 1"
    if any(later <= earlier for earlier, later in zip(part_lines, part_lines[1:])):
        return f"its parts start at lines {_shown(part_lines)}, not increasing"
    return None


def part_lines_problem(source: str, part_lines: tuple[int, ...]) -> str | None:
    """Why `part_lines` does not cut `source` into parts (shape_problem, and within the file), or None."""
    problem = shape_problem(part_lines)
    if problem is not None:
        return problem
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
    for match in STATEMENT_START.finditer(source):
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
