"""Reading the guards a standalone Dynamo artifact renders as Python (with ast and json, never
executed): each guard function's checks by label, each variant's tensor rows and GLOBAL_STATE fields.
python_code is parsed once for all of them."""
from __future__ import annotations

import ast
import functools
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from precompile.artifact.metadata import DynamoMetadata
from precompile.artifact.opaque_state import nodes
from precompile.artifact.pycode import code_lines, cyclic_gc_paused
from precompile.errors import PrecompileError
from precompile.inspect.parsing import check_text
from precompile.inspect.parsing.chunked_parse import parsed_chunks


def shape_text(shape) -> str:
    return "(" + ", ".join("*" if dim is None else str(dim) for dim in shape) + ("," if len(shape) == 1 else "") + ")"



_FUNCTION = re.compile(r"guards_(\d+)_(\d+)")
_TENSORS = re.compile(r"_tensors_(\d+)_(\d+)")
_SOURCE_LOCAL = re.compile(r"s\d+")
# What a --type filter names beyond a guard type itself: the part of a tensor's guard it checks.

def tensor_rows(source: str | bytes | None, lines: Rendered | None = None) -> dict[tuple[int, int], dict[str, str]]:
    """{(frame index, variant): {tensor source: what its TENSOR_MATCH checks}} from the literal rows
    of each `_tensors_F_V = _TensorMatch((...))` python_code renders (read with ast, never executed)."""
    found: dict[tuple[int, int], dict[str, str]] = {}
    for name, call in _literal_calls(source, _TENSORS, lines):
        try:
            rows = ast.literal_eval(call.args[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        match = _TENSORS.fullmatch(name)
        assert match is not None
        inference, modes = _keyword(call, "inference", int), _keyword(call, "modes", str)
        found[(int(match.group(1)), int(match.group(2)))] = {
            str(row[0]): _tensor_text(row, index in inference, modes)
            for index, row in enumerate(rows) if isinstance(row, tuple) and len(row) >= 7
        }
    return found


def _keyword(call: ast.Call, name: str, kind: type) -> tuple:
    """A `_TensorMatch` keyword's literal tuple of `kind` items (empty where absent or anything else)."""
    for keyword in call.keywords:
        if keyword.arg == name:
            try:
                value = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return ()
            return value if isinstance(value, tuple) and all(type(item) is kind for item in value) else ()
    return ()


_GLOBAL_STATE = re.compile(r"_global_state_(\d+)_(\d+)")
# torch's ScalarType codes, as the GLOBAL_STATE guard's state writes a dtype.
_SCALAR_TYPES = {0: "torch.uint8", 1: "torch.int8", 2: "torch.int16", 3: "torch.int32", 4: "torch.int64", 5: "torch.float16",
                 6: "torch.float32", 7: "torch.float64", 8: "torch.complex32", 9: "torch.complex64", 10: "torch.complex128",
                 11: "torch.bool", 15: "torch.bfloat16"}
UNCHECKED_GLOBAL_STATE = ("num_threads",)
"""Fields of the GLOBAL_STATE guard's state a served call does not check: the driver keeps the thread
count at the serving process's own (see codegen/drivers/dynamo_guards._GlobalState)."""


def global_state_rows(source: str | bytes | None, lines: Rendered | None = None) -> dict[tuple[int, int], dict[str, str]]:
    """{(frame index, variant): {field: the value its GLOBAL_STATE guard checks}} from the JSON literal
    of each `_global_state_F_V = _GlobalState('...')` python_code renders (read with ast and json,
    never executed): grad_mode, default_dtype (by name), deterministic algorithms, autocast, ...;
    the fields a served call does not check left out."""
    import json

    found: dict[tuple[int, int], dict[str, str]] = {}
    for name, call in _literal_calls(source, _GLOBAL_STATE, lines):
        argument = call.args[0]
        if not (isinstance(argument, ast.Constant) and isinstance(argument.value, str)):
            continue
        try:
            state = json.loads(argument.value)
        except (ValueError, RecursionError):
            continue
        if not isinstance(state, dict):
            continue
        match = _GLOBAL_STATE.fullmatch(name)
        assert match is not None
        found[(int(match.group(1)), int(match.group(2)))] = {
            str(key): _state_text(key, value) for key, value in sorted(state.items()) if key not in UNCHECKED_GLOBAL_STATE}
    return found


def _state_text(key: str, value) -> str:
    import json

    if key == "default_dtype" and type(value) is int:
        return _SCALAR_TYPES.get(value, f"ScalarType {value}")
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _literal_calls(source: str | bytes | None, name: re.Pattern,
                   lines: Rendered | None) -> list[tuple[str, ast.Call]]:
    """The top-level `NAME = Call(arg, ...)` statements of python_code whose NAME matches `name`."""
    return [(node.targets[0].id, node.value) for node, _ in _statements(source, lines) or ()
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)
            and node.value.args and name.fullmatch(node.targets[0].id)]


def _read(node: ast.stmt) -> bool:
    """A top-level statement the readers here read: a guard function, or `NAME = ...` of a rendered row."""
    if isinstance(node, ast.FunctionDef):
        return _FUNCTION.fullmatch(node.name) is not None
    return (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and (_TENSORS.fullmatch(node.targets[0].id) or _GLOBAL_STATE.fullmatch(node.targets[0].id)) is not None)


KEPT_LINES = 100_000
"""The most lines of rendered guards (about 8 MB) whose syntax trees the parse that read python_code
keeps for these readers (about 40 bytes of tree per byte of text); past it they parse them again."""


@dataclass(frozen=True)
class Rendered:
    """Where python_code renders its guards, as the parse that read it found them: the lines (first,
    last) of each top-level statement the readers here read and, when they are within KEPT_LINES,
    their syntax trees with the number of lines before the part each was parsed in (compared and
    hashed by the lines alone)."""

    spans: tuple[tuple[int, int], ...]
    statements: tuple[tuple[ast.stmt, int], ...] | None = dataclass_field(default=None, compare=False, hash=False)


def read_statements(tree: ast.Module) -> list[ast.stmt]:
    """The top-level statements of `tree` the readers here read."""
    return [node for node in tree.body if _read(node)]


@functools.lru_cache(maxsize=2)
def _statements(source: str | bytes | None, lines: Rendered | None = None) -> list[tuple[ast.stmt, int]] | None:
    """The top-level statements of python_code the readers of its rendered guards read, each with the
    number of lines before the text it was parsed from (None: not Python text). Given `lines` (from
    the parse that read the file), its trees are these statements, or where it kept none only its
    lines are parsed again; otherwise python_code is parsed a part at a time (`chunked_parse`);
    either way only these statements' trees are kept. They are shared: their readers never change them."""
    if source is None:
        return None
    try:
        text = source.decode("utf-8") if isinstance(source, bytes) else source
        if lines is not None and lines.statements is not None:
            return list(lines.statements)
        if lines is not None:
            found = _spanned(text, lines.spans)
            if found is not None:
                return found
        return [(node, chunk.first_line - 1) for chunk in parsed_chunks(text, filename="python_code")
                for node in chunk.tree.body if _read(node)]
    except (PrecompileError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return None


def _spanned(text: str, lines: tuple[tuple[int, int], ...]) -> list[tuple[ast.stmt, int]] | None:
    """The statements of `lines` parsed line span by line span; None where a span does not parse
    alone (a statement after `;` on a line a construct began above) or holds other statements."""
    starts = [0]
    for _, last in lines:  # the offsets of the lines the spans need, found once, in order
        while len(starts) <= last:
            at = text.find("\n", starts[-1])
            starts.append(len(text) if at < 0 else at + 1)
    found = []
    with cyclic_gc_paused():
        for first, last in lines:
            try:
                tree = ast.parse(text[starts[first - 1]:starts[last]])
            except (SyntaxError, ValueError):
                return None
            kept = [node for node in tree.body if _read(node)]
            if len(kept) != 1:
                return None
            found.append((kept[0], first - 1))
    return found


def _tensor_text(row: tuple, inference: bool = False, modes: tuple = ()) -> str:
    """What one TENSOR_MATCH row checks; an inference tensor and the modes its dispatch keys were read
    under (inference_mode, autocast) are named where the capture's call had them."""
    _, kind, dtype, device, requires_grad, sizes, strides = row[:7]
    return (f"{str(kind).rpartition(':')[2]} {dtype} on {device}, size {shape_text(sizes)}, stride {shape_text(strides)}, "
            f"requires_grad={requires_grad}" + (", an inference tensor" if inference else "")
            + (f", keys read under {', '.join(modes)}" if modes else ""))


def rendered_checks(source: str | bytes | None, meta: DynamoMetadata, lines: Rendered | None = None,
                    origins: dict[tuple[str, int], dict[str, str]] | None = None) -> dict[tuple[str, int], dict[str, str]]:
    """{(frame, variant): {guard label: the condition that runs}} of a standalone artifact whose
    guards python_code renders as functions `guards_F_V` (read with ast, never executed); a guard
    torch itself skips maps to "not checked: why". Empty for artifacts without rendered guards.
    `origins`, when given, receives {(frame, variant): {guard label: the user's line that made it}},
    from the comment beside each label (capturing/dynamo/guard_origin.py). A function of the same
    text as one the call before read (the other release of a diff) is not read again."""
    global _last_functions
    statements = _statements(source, lines)
    if statements is None or source is None:
        return {}
    text = source.decode("utf-8") if isinstance(source, bytes) else source
    # Once, numbered as the compiler numbers them (str.splitlines also breaks at a form feed, \x85,
    # \u2028, ...): the comments, segments and each function's text below index into it.
    file_lines = [line.rstrip("\r\n") for line in code_lines(text)]
    found: dict[tuple[str, int], dict[str, str]] = {}
    functions: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for node, before in statements:
        if not isinstance(node, ast.FunctionDef):
            continue
        match = _FUNCTION.fullmatch(node.name)
        if match is None or int(match.group(1)) >= len(meta.frames):
            continue
        key = (meta.frames[int(match.group(1))].qualname or meta.frames[int(match.group(1))].name, int(match.group(2)))
        written = "\n".join(file_lines[node.lineno + before - 1:(node.end_lineno or node.lineno) + before])
        read = functions.get(written) or _last_functions.get(written) or _function_checks(node, before, file_lines)
        functions[written] = read
        found[key] = dict(read[0])
        if origins is not None and read[1]:
            origins.setdefault(key, {}).update(read[1])
    _last_functions = functions
    return found


_last_functions: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
"""What `_function_checks` read of each guard function the last `rendered_checks` call read, by its text."""


def _function_checks(node: ast.FunctionDef, before: int, file_lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({guard label: the condition that runs, or "not checked: why"}, {guard label: the user's line
    that made it}) of one rendered guard function (parsed `before` lines into the file)."""
    checks: dict[str, str] = {}
    made: dict[str, str] = {}
    first, last = node.lineno + before, (node.end_lineno or node.lineno) + before
    for line in file_lines[first:last]:
        note = line.strip()
        if note.startswith("# ") and ": " in note:
            label, _, why = note[2:].partition(": ")
            checks.setdefault(label, f"not checked: {why}")
    failing: str | None = None  # the label the rendered guard assigns before its `if`
    spelled = _SpelledOut()
    for statement in _statements_within(node):
        targets = [getattr(t, "id", None) for t in statement.targets] if isinstance(statement, ast.Assign) else []
        if isinstance(statement, ast.Assign) and targets == ["failing"]:
            value = statement.value.value if isinstance(statement.value, ast.Constant) else None
            failing = value if isinstance(value, str) else None
            made_at = _trailing_comment(file_lines, statement, before)
            if failing is not None and made_at:
                made[failing] = made_at
        elif isinstance(statement, ast.Assign) and len(targets) == 1 and _SOURCE_LOCAL.fullmatch(targets[0] or ""):
            spelled.bind(str(targets[0]), statement.value)
        elif isinstance(statement, ast.If) and failing is not None:
            test = statement.test.operand if isinstance(statement.test, ast.UnaryOp) else statement.test
            checks[failing] = spelled.text(test) or " ".join(_segment(file_lines, test, before).split())
            failing = None
    return checks, made


def _statements_within(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `node` that are not expressions, in the order `ast.walk` gives them (breadth first):
    expressions hold no statement, so their subtrees, most of a guard function's nodes, are not walked."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        yield node
        for field in node._fields:
            value = getattr(node, field, None)
            if type(value) is list:
                todo.extend(item for item in value if isinstance(item, ast.AST) and not isinstance(item, ast.expr))
            elif isinstance(value, ast.AST) and not isinstance(value, (ast.expr, ast.expr_context)):
                todo.append(value)


def _trailing_comment(lines: list[str], statement: ast.stmt, before: int) -> str:
    """The comment after `statement` on its last line (its text after `# `), or ""."""
    last = (statement.end_lineno or statement.lineno) - 1 + before
    if last >= len(lines) or statement.end_col_offset is None:
        return ""
    rest = lines[last].encode("utf-8")[statement.end_col_offset:].decode("utf-8", "replace").strip()
    return rest[2:].strip() if rest.startswith("# ") else ""


def _segment(lines: list[str], node: ast.expr, before: int) -> str:
    """The source text of `node` (parsed in a part of the file `before` lines in), as
    ast.get_source_segment gives it (column offsets count UTF-8 bytes), from lines split once rather
    than once per call."""
    first, last = node.lineno - 1 + before, (node.end_lineno or node.lineno) - 1 + before
    if first < 0 or last >= len(lines) or node.end_col_offset is None:
        return ""
    if first == last:
        return lines[first].encode("utf-8")[node.col_offset:node.end_col_offset].decode("utf-8", "replace")
    parts = [lines[first].encode("utf-8")[node.col_offset:].decode("utf-8", "replace"), *lines[first + 1:last],
             lines[last].encode("utf-8")[:node.end_col_offset].decode("utf-8", "replace")]
    return "\n".join(parts)


class _SpelledOut:
    """The rendered checks with the sources their guard function reads into locals (`sN = path`,
    see precompile.capturing.dynamo.shared_sources) spelled out again, as the guards name them.
    Only a local bound to an access path is spelled out, up to MAX_SPELLED_OUT characters, in a
    check of up to MAX_CHECK characters of them (a hostile file could chain locals into text of any
    length); others stay as written."""

    MAX_SPELLED_OUT = 4096
    MAX_CHECK = 65536

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}  # local: its path spelled out, as ast.unparse writes it

    def bind(self, name: str, value: ast.expr) -> None:
        before = self.paths.pop(name, None)  # `s1 = s1.a` reads the s1 bound before
        steps: list[ast.Attribute | ast.Subscript] = []
        node = value
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Subscript) and not _plain_key(node.slice):
                return
            steps.append(node)
            node = node.value
        if not steps or not isinstance(node, ast.Name):
            return
        parts = [(before if node.id == name else self.paths.get(node.id)) or node.id]
        length = len(parts[0])
        for step in reversed(steps):
            # what ast.unparse writes for the step: a path's steps never need parentheses
            parts.append(f".{step.attr}" if isinstance(step, ast.Attribute) else f"[{ast.unparse(step.slice)}]")
            length += len(parts[-1])
            if length > self.MAX_SPELLED_OUT:
                return
        self.paths[name] = "".join(parts)

    def text(self, test: ast.AST) -> str | None:
        """The check spelled out, or None where it reads no local this knows: unparsed with each
        local's name written as its path, as unparsing the check with the paths in place of the
        names writes it (a path is an atom: no parentheses change), without copying the check or
        unparsing every path again in every check."""
        try:
            fast, used = check_text.written(test, self.paths, self.MAX_CHECK)
            return fast if used else None
        except check_text.TooLong:
            return None
        except (check_text.Unwritten, RecursionError):
            pass  # another shape: the unparser writes it
        writer = _PathWriter(self.paths, self.MAX_CHECK)
        try:
            try:
                written = writer.visit(test)
            except _InFormattedString:  # unparse writes an f-string with a writer of its own: the paths put in the check
                writer.names = [n.id for n in nodes(test) if isinstance(n, ast.Name) and n.id in self.paths]
                writer.binds = True
                if sum(len(self.paths[name]) for name in writer.names) > self.MAX_CHECK:
                    return None
                written = ast.unparse(self.substituted(test))
        except (_TooLong, RecursionError, ValueError, MemoryError, SyntaxError):  # past MAX_CHECK, nested past the stack, an int past str()'s digits
            return None
        if not writer.names:
            return None
        if writer.binds and not _bound_within(test).isdisjoint(writer.names):
            return None  # a name the check binds itself shadows the local there: as written
        return written


    def substituted(self, node: ast.AST) -> ast.AST:
        """`node` with each local this knows replaced by its path; subtrees without one are shared,
        not copied, and `node` itself is left as it is."""
        if isinstance(node, ast.Name):
            return node if node.id not in self.paths else ast.parse(self.paths[node.id], mode="eval").body
        changed: dict[str, object] = {}
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                new = self.substituted(value)
                if new is not value:
                    changed[field] = new
            elif isinstance(value, list) and any(isinstance(item, ast.AST) for item in value):
                items = [self.substituted(item) if isinstance(item, ast.AST) else item for item in value]
                if any(a is not b for a, b in zip(items, value)):
                    changed[field] = items
        if not changed:
            return node
        return type(node)(**{**{field: getattr(node, field, None) for field in node._fields}, **changed})


class _TooLong(Exception):
    pass


class _InFormattedString(Exception):
    pass


class _PathWriter(ast._Unparser):  # type: ignore[name-defined]
    """ast.unparse, each name of a local bound to a path written as the path; stops past `most`
    characters of paths (a hostile file could name a long path any number of times)."""

    def __init__(self, paths: dict[str, str], most: int) -> None:
        super().__init__()
        self.paths, self.most, self.written = paths, most, 0
        self.names: list[str] = []
        self.binds = False

    def visit_Name(self, node: ast.Name) -> None:
        path = self.paths.get(node.id)
        if path is None:
            self.write(node.id)
            return
        self.written += len(path)
        if self.written > self.most:
            raise _TooLong
        self.names.append(node.id)
        self.write(path)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.binds = True
        super().visit_comprehension(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.binds = True
        super().visit_Lambda(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.binds = True
        super().visit_NamedExpr(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        raise _InFormattedString


def _bound_within(test: ast.AST) -> set[str]:
    """The names a check binds itself: comprehension targets, lambda parameters, `:=` targets."""
    bound = set()
    for node in ast.walk(test):
        if isinstance(node, ast.comprehension):
            bound |= {name.id for name in ast.walk(node.target) if isinstance(name, ast.Name)}
        elif isinstance(node, ast.Lambda):
            bound |= {arg.arg for arg in ast.walk(node.args) if isinstance(arg, ast.arg)}
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
    return bound


def _plain_key(node: ast.expr) -> bool:
    """A subscript a guard source uses: a string, or an int that prints in a few digits."""
    return isinstance(node, ast.Constant) and (type(node.value) is str or (type(node.value) is int and abs(node.value) < 2**63))
