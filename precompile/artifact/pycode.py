"""Read python_code's metadata with `ast`: parse, take the top-level literal assignments, convert.

Nothing here executes or imports anything from the artifact. The last top-level assignment of a
name wins, as it would under exec. `load` parses once: it reads the metadata from the tree that
`parse_source` returns and compiles that same tree.
"""
from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import io
from collections.abc import Iterator
from typing import Any

import msgspec

from precompile.artifact.envelope import FORMAT_VERSION
from precompile.artifact.metadata import ArtifactMetadata, DynamoMetadata, MakeFxMetadata
from precompile.errors import PrecompileError

MAX_PYTHON_CODE_SIZE = 512 * 1024 * 1024

# The TRACER tags of the metadata layouts in ArtifactMetadata, and the literal names they read.
_LAYOUTS = (MakeFxMetadata, DynamoMetadata)
_TRACERS = tuple(layout.__struct_config__.tag for layout in _LAYOUTS)
_CONSUMED = frozenset(
    {"FORMAT_VERSION", "TRACER"} | {field.encode_name for layout in _LAYOUTS for field in msgspec.structs.fields(layout)}
)


def code_hash(python_code: bytes) -> str:
    return hashlib.sha256(python_code).hexdigest()


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Keep Python's cyclic collector from running while a syntax tree (or code unmarshalled) is built.

    A tree is one allocation per node (tens of thousands for an Inductor artifact) and holds no
    cycle: refcounting frees it. Built right after `import torch`, whose hundreds of thousands of
    objects the collector has yet to examine, those allocations would set off a full collection
    over all of torch's objects (about 0.1 s) in the middle of load. Paused, the collector runs when
    the serving process next allocates enough to need it. The switch is process-wide: a thread
    that turns the collector off during a parse finds it back on afterwards.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


parses = 0
"""How many python_code texts this process parsed (a load from a cache carrying its metadata and
bytecode parses none)."""


def parse_source(source: str, *, filename: str = "python_code") -> ast.Module:
    """The syntax tree of a python_code, or a PrecompileError saying it is not valid Python."""
    global parses
    parses += 1
    try:
        with cyclic_gc_paused():
            return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise PrecompileError(
            f"{filename} is not valid Python (line {exc.lineno}: {exc.msg}); it is not a precompile artifact"
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise PrecompileError(f"{filename} cannot be parsed as Python ({type(exc).__name__}); it is not a precompile artifact") from None


def literal_assignments(source: str | ast.Module, *, filename: str = "python_code", first_line: int = 1) -> dict[str, Any]:
    """The top-level `UPPER_NAME = <literal>` assignments of `source` (not `_PRIVATE` ones), evaluated
    with literal_eval. `source` is the text or the tree parse_source made of it; `first_line` is the
    line of the file it starts at, when it is part of one."""
    tree = source if isinstance(source, ast.Module) else parse_source(source, filename=filename)
    values: dict[str, Any] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not name.isupper() or name.startswith("_"):
            continue  # metadata is public UPPER_CASE; a driver's private _CONSTANTS are code
        try:
            values[name] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            values[name] = NotALiteral(node.lineno + first_line - 1)
    return values


class NotALiteral:
    def __init__(self, lineno: int) -> None:
        self.lineno = lineno


def code_lines(text: str) -> list[str]:
    """`text`'s lines as the compiler numbers them, each with its ending: a line ends at \\n, \\r\\n
    or \\r only (`str.splitlines` also breaks at a form feed, \\x1c-\\x1e, \\x85, \\u2028 and
    \\u2029, which would shift every line number after one)."""
    return io.StringIO(text, newline="").readlines()


def decode_source(python_code: bytes, *, filename: str = "python_code") -> str:
    try:
        return python_code.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrecompileError(
            f"{filename} is not UTF-8 text (byte {exc.start}); it is not a precompile artifact "
            "(were the artifact and cache paths swapped?)"
        ) from None


def parse_metadata(source: str | ast.Module, *, filename: str = "python_code") -> ArtifactMetadata:
    """Typed metadata of a python_code (its text or parse_source's tree of it), or a PrecompileError
    that says what is wrong with it."""
    return metadata_of(literal_assignments(source, filename=filename), filename=filename)


def metadata_of(values: dict[str, Any], *, filename: str = "python_code") -> ArtifactMetadata:
    """Typed metadata of python_code's `literal_assignments`, or a PrecompileError that says what is wrong with them."""
    if "FORMAT_VERSION" not in values or "TRACER" not in values:
        raise PrecompileError(
            f"{filename} is not a precompile artifact: it has no FORMAT_VERSION/TRACER metadata literals"
        )
    broken = sorted(name for name, value in values.items() if isinstance(value, NotALiteral) and name in _CONSUMED)
    if broken:
        where = ", ".join(f"{name} (line {values[name].lineno})" for name in broken)
        raise PrecompileError(f"{filename} has metadata that is not a Python literal: {where}")
    version = values["FORMAT_VERSION"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise PrecompileError(f"{filename} has FORMAT_VERSION = {version!r}; expected an integer")
    if version > FORMAT_VERSION:
        raise PrecompileError(
            f"{filename} has format version {version}, newer than this precompile understands "
            f"(up to {FORMAT_VERSION}); upgrade precompile to read it"
        )
    if values["TRACER"] not in _TRACERS:
        raise PrecompileError(
            f"{filename} has TRACER = {values['TRACER']!r}; this precompile reads {', '.join(map(repr, _TRACERS))}"
        )
    try:
        return msgspec.convert(values, ArtifactMetadata)
    except msgspec.ValidationError as exc:
        raise PrecompileError(f"{filename} has malformed metadata: {exc}") from None
