"""Where a Dynamo artifact's opaque parts sit in python_code, found by one rule that inspect and load share.

The driver reads two names from python_code's globals: `_dynamo_state` (base64 of the pickle `load`
unpickles, or None) and `_dynamo_bytecode` (key -> base64 of a marshalled code object, each entry
labelled by the comment line above it: "...: N bytes, sha256 H"). A reader that finds them by a
looser rule than the interpreter (a bytes literal, a sum of literals, a second assignment, a write
through `globals()`) scans something other than what load decodes. So the only accepted spelling is
one top-level assignment of literals, the name bound nowhere else; any other is a problem that
inspect reports and load refuses. Torch-free: the tree is read with `ast`, nothing is executed.
"""
from __future__ import annotations

import ast
import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from precompile.artifact.envelope import OpaqueCheck

STATE = "_dynamo_state"
BYTECODE = "_dynamo_bytecode"
BYTECODE_SHA256 = "__precompile_bytecode_sha256__"
"""The global load seeds for the driver: each bytecode key's labelled sha256, checked before marshal.loads."""
NOT_CANONICAL = "is not in the canonical form, cannot be scanned"
REMEDY = "do not load this artifact; capture it again (precompile writes one canonical form)"
_LABEL = re.compile(r"^\s*#.*: (\d+) bytes, sha256 ([0-9a-f]{64})\s*$")


@dataclass(frozen=True)
class Found:
    """A name's one canonical assignment (None when the name is absent or spelled otherwise) and why not."""

    assignment: ast.Assign | None = None
    problem: str | None = None


def _is_state_literal(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and (value.value is None or type(value.value) is str)


def _is_bytecode_literal(value: ast.expr) -> bool:
    return isinstance(value, ast.Dict) and all(
        isinstance(node, ast.Constant) and type(node.value) is str for node in (*value.keys, *value.values))


def _binds(node: ast.AST, name: str) -> bool:
    """Whether `node` binds or deletes `name` (anywhere: a module, a function, a class, a pattern)."""
    if isinstance(node, ast.Name):
        return node.id == name and not isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.Attribute):
        return node.attr == name and not isinstance(node.ctx, ast.Load)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return name in node.names
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.alias):
        return (node.asname or node.name.split(".")[0]) == name
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return node.name == name
    if isinstance(node, ast.MatchMapping):
        return node.rest == name
    return isinstance(node, ast.keyword) and node.arg == name


_BINDERS = (ast.Name, ast.Attribute, ast.Global, ast.Nonlocal, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
            ast.alias, ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.MatchMapping, ast.keyword)
"""The node types `_binds` can be true of: every other node is only checked as a string."""


_LEAVES = (ast.Name, ast.Constant)
"""The commonest nodes, which hold no node but an expression context: their fields are not looked into."""


def nodes(tree: ast.AST):
    """Every node of the tree, each before its children, expression contexts (Load, Store) skipped:
    `ast.walk` without its per-node generator, a third less time on a big file."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if type(node) in _LEAVES:
            continue
        for field in node._fields:
            value = getattr(node, field, None)
            if type(value) is list:
                stack.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST) and field != "ctx":
                stack.append(value)


def mentions(tree: ast.Module, names: tuple[str, ...],
             literals: list[tuple[ast.Constant, str | None]] | None = None) -> dict[str, list[ast.AST]]:
    """For each name, every node that binds it or spells it in a string other than as the key of a
    plain read `x["name"]` (the driver's own `metadata["_dynamo_bytecode"]`): `globals()["name"] = ...`,
    `setattr(m, "name", ...)`, `exec("name = ...")`, `dict(name=...)`. One walk, each node checked by
    its type once (not once per name); it visits a subscript before its key, so the reads are known
    when the key is reached. `literals`, when given, receives in the same walk every str and bytes
    literal, with the name it is assigned to alone (`name = literal`, `name: T = literal`) or None."""
    found: dict[str, list[ast.AST]] = {name: [] for name in names}
    reads: set[int] = set()
    assigned: dict[int, str] = {}
    for node in nodes(tree):
        kind = type(node)
        if kind is ast.Constant:
            if type(node.value) is str or type(node.value) is bytes:  # a number, None, ...: spells no name
                _note_literal(node, found, node.value if id(node) not in reads else None, literals, assigned)
        elif kind is ast.Name:
            if node.id in names and not isinstance(node.ctx, ast.Load):
                found[node.id].append(node)
        elif isinstance(node, ast.Subscript):
            if isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
                reads.add(id(node.slice))
        elif isinstance(node, _BINDERS):
            _record(found, node, _binds)
        elif literals is not None and (kind is ast.Assign or kind is ast.AnnAssign):
            targets = node.targets if kind is ast.Assign else [node.target]
            if len(targets) == 1 and type(targets[0]) is ast.Name and node.value is not None:
                assigned[id(node.value)] = targets[0].id  # the walk reaches the value after its statement
    return found


def _note_literal(node: ast.Constant, found: dict[str, list[ast.AST]], value: str | bytes | None,
                  literals: list[tuple[ast.Constant, str | None]] | None, assigned: dict[int, str]) -> None:
    """A str or bytes literal for `mentions`: each name its `value` spells (None: a plain read's key;
    bytes read as Latin-1), and the literal itself when `literals` collects them. One call a literal:
    a call per name took a third of the walk."""
    if literals is not None:
        literals.append((node, assigned.get(id(node))))
    if value is not None:
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        for name in found:
            if name in text:
                found[name].append(node)


def names_a_part(statement: ast.stmt) -> bool:
    """Whether a top-level statement binds or spells an opaque part as `mentions` counts it, or names
    the modules the opaque state's classes may come from (CAPTURED_FIELDS): a tree of the statements
    that do finds what the whole file's tree finds (expected_code keeps only them)."""
    return (_captured_field(statement) is not None
            or any(mentions(ast.Module(body=[statement], type_ignores=[]), (STATE, BYTECODE)).values()))


def _captured_field(statement: ast.stmt) -> str | None:
    from precompile.artifact.pickle_policy import CAPTURED_FIELDS  # the scan's modules load only where a state is scanned

    if (isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name)
            and statement.targets[0].id in CAPTURED_FIELDS):
        return statement.targets[0].id
    return None


def _captured_values(tree: ast.Module) -> dict:
    """The CAPTURED_FIELDS literals of python_code's top level, read with ast (one not a literal is left out)."""
    values = {}
    for statement in tree.body:
        name = _captured_field(statement)
        if name is not None:
            try:
                values[name] = ast.literal_eval(statement.value)  # type: ignore[attr-defined]
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
    return values


def state_problems(tree: ast.Module, state: Found) -> list[str]:
    """Why load must not unpickle the opaque state (its canonical assignment `state`): the findings of
    the strict scan verify makes of it (`pickle_scan`, by `dynamo_state_reviewed`: an import neither
    data-only nor reviewed, or a scan that cannot finish), in the words verify uses."""
    value = state.assignment.value if state.assignment is not None else None
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return []
    from precompile.artifact.pickle_policy import captured_modules, dynamo_state_reviewed
    from precompile.artifact.pickle_scan import finding_text, scan_pickle

    where = f"{STATE} (line {value.lineno})"
    try:
        data = decode(value.value)
    except ValueError as exc:
        return [f"{where} is {exc}: load refuses it, and it cannot be scanned; {REMEDY}"]
    scan = scan_pickle(data, member=where, reviewed=dynamo_state_reviewed(captured_modules(_captured_values(tree))))
    problems = [finding_text(scan, imp) for imp in scan.findings]
    if scan.problem is not None:
        problems.append(finding_text(scan, None))
    return [f"{problem}; {REMEDY}" for problem in problems]


def _record(found: dict[str, list[ast.AST]], node: ast.AST, test: Callable[[ast.AST, str], bool]) -> None:
    for name, nodes_of_name in found.items():
        if test(node, name):
            nodes_of_name.append(node)


_CANONICAL: dict[str, tuple[Callable[[ast.expr], bool], str]] = {
    STATE: (_is_state_literal, "a base64 str literal or None"),
    BYTECODE: (_is_bytecode_literal, "a dict of str keys to base64 str literals"),
}


def is_canonical_value(name: str, value: ast.expr) -> bool:
    """Whether `value` is what load reads `name` (STATE or BYTECODE) as: one literal of its form."""
    return _CANONICAL[name][0](value)


def not_canonical(name: str, lines: Iterable[int]) -> str:
    """The problem of a name spelled other than canonically, at `lines` (its bindings and spellings)."""
    shown = ", ".join(str(line) for line in sorted(set(lines)))
    return (f"{name} (line {shown}) {NOT_CANONICAL}: load reads it as written once, at top level, as {_CANONICAL[name][1]}; "
            f"this file spells it otherwise (another expression, several bindings, or a write through a string name); {REMEDY}")


def _find(tree: ast.Module, name: str, found: list[ast.AST]) -> Found:
    """The one top-level `name = <literal>` when that is the name's only binding, or the problem."""
    if not found:
        return Found()
    candidates = [node for node in tree.body
                  if isinstance(node, ast.Assign) and len(node.targets) == 1 and found[0] is node.targets[0]]
    if len(found) == 1 and candidates and is_canonical_value(name, candidates[0].value):
        return Found(assignment=candidates[0])
    return Found(problem=not_canonical(name, (getattr(node, "lineno", 0) for node in found)))


def find_parts(tree: ast.Module) -> tuple[Found, Found]:
    """The opaque state's and the marshalled bytecode's canonical assignments (or problems)."""
    found = mentions(tree, (STATE, BYTECODE))
    return _find(tree, STATE, found[STATE]), _find(tree, BYTECODE, found[BYTECODE])


def decode(text: str) -> bytes:
    """A base64 literal as load decodes it: strictly (no characters outside the alphabet); raises ValueError."""
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not strict base64 ({exc})") from None


@dataclass(frozen=True)
class Blob:
    key: str
    line: int
    text: str
    label: tuple[int, str] | None
    """(size, sha256) from the comment line above the entry; None when there is none."""


def bytecode_blobs(assignment: ast.Assign, lines: list[str], before: int = 0) -> list[Blob]:
    """Each entry of the canonical `_dynamo_bytecode` dict with its label (`lines`: the source's lines;
    `before`: the lines of the file before the part `assignment` was parsed from)."""
    value = assignment.value
    assert isinstance(value, ast.Dict)
    blobs = []
    for key, text in zip(value.keys, value.values):
        # find_parts accepted only a dict of str constants (_is_bytecode_literal)
        assert isinstance(key, ast.Constant) and isinstance(key.value, str)
        assert isinstance(text, ast.Constant) and isinstance(text.value, str)
        line = key.lineno + before
        match = _LABEL.match(lines[line - 2]) if line >= 2 else None
        label = (int(match.group(1)), match.group(2)) if match else None
        blobs.append(Blob(key=key.value, line=line, text=text.value, label=label))
    return blobs


def blob_problem(blob: Blob) -> str | None:
    """Why a bytecode entry does not hold what its label says, or None."""
    if blob.label is None:
        return f"{BYTECODE}[{blob.key!r}] (line {blob.line}) has no 'N bytes, sha256 H' label above it; {REMEDY}"
    try:
        data = decode(blob.text)
    except ValueError as exc:
        return f"{BYTECODE}[{blob.key!r}] (line {blob.line}) is {exc}; {REMEDY}"
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    if (size, digest) != blob.label:
        return (f"{BYTECODE}[{blob.key!r}] (line {blob.line}) holds {size} bytes, sha256 {digest}, but is labelled "
                f"{blob.label[0]} bytes, sha256 {blob.label[1]}: the marshalled code was swapped; {REMEDY}")
    return None


def load_problems(tree: ast.Module, source: str) -> tuple[list[str], dict[str, str] | None]:
    """For load: why the opaque parts are not as the writer wrote them (another spelling, a blob that
    does not match its label: python_code carries its own driver, and an older one checks nothing; an
    opaque state whose strict scan has a finding, as verify scans it),
    and each bytecode key's labelled sha256 (None without bytecode), which load seeds as
    BYTECODE_SHA256 for the driver to check again before marshal.loads."""
    state, bytecode = find_parts(tree)
    problems = [found.problem for found in (state, bytecode) if found.problem is not None] + state_problems(tree, state)
    if bytecode.assignment is None:
        return problems, None
    blobs = bytecode_blobs(bytecode.assignment, source.splitlines())
    problems.extend(problem for problem in map(blob_problem, blobs) if problem is not None)
    return problems, {blob.key: blob.label[1] for blob in blobs if blob.label is not None}


def mentioned(python_code: str | bytes) -> bool:
    """Whether python_code (its text, or its UTF-8 bytes) names an opaque part: the rule applies to it."""
    if isinstance(python_code, bytes):
        return STATE.encode() in python_code or BYTECODE.encode() in python_code
    return STATE in python_code or BYTECODE in python_code


def checked(tree: ast.Module, source: str) -> OpaqueCheck | None:
    """What load's rule finds in python_code (`source`, parsed as `tree`), as load applies it whichever
    way python_code runs (compiled here, or as the bytecode its cache carries, beside which capture
    records this); None when python_code names no opaque part."""
    if not mentioned(source):
        return None
    problems, labels = load_problems(tree, source)
    return OpaqueCheck(problems=tuple(problems), labels=labels)
