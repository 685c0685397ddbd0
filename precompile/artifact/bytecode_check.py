"""verify's proof that a cache's stored bytecode is its python_code's (artifact/bytecode.py): the
record checked against what capture writes, python_code compiled again as capture compiled it (whole,
or a part at a time: artifact/code_parts.py) and the marshalled bytes compared by sha256, never loaded.
Torch-free; a MemoryError is the caller's (inspect/verify/bytecode_proof.py runs this in a bounded child).
"""
from __future__ import annotations

import ast
import hashlib

import msgspec

from precompile.artifact import code_parts
from precompile.artifact.bytecode import (
    COMPILE_FLAGS,
    MARSHAL_VERSION,
    Statements,
    blob_problem,
    code_filename,
    decompressed,
    expected_code,
    layout_problem,
    left_out_literals,
    left_out_problem,
    listed_names,
    modules_and_opaque,
    whole_tree,
)
from precompile.artifact.envelope import CompiledCode, OpaqueCheck


def bytecode_problem(source: str, code_hash: str, compiled: CompiledCode, tree: Statements) -> str | None:
    """Why the stored bytecode is not python_code compiled (verify's proof), or None.

    python_code is compiled again here and marshalled; the stored bytes are compared (by sha256, so that
    they are not held while it compiles), never loaded.
    `tree`: its syntax tree or its top-level statements (see bytecode.expected_code)."""
    problem = _record_problem(source, code_hash, compiled)
    if problem is not None:
        return problem
    try:
        stored = hashlib.sha256(decompressed(compiled)).digest()  # not held while python_code compiles
    except ValueError as exc:
        return str(exc)
    if compiled.left_out:
        tree = whole_tree(tree)
        problem = _unprovable_left_out(source, compiled, tree)
        if problem is not None:
            return problem
    try:
        expected, found = _expected(source, code_hash, compiled, tree)
    except code_parts.NotInParts as exc:
        return f"python_code does not run as the parts it is stored in: {exc}"
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"python_code does not compile here ({type(exc).__name__})"
    if expected != stored:
        return "its bytes differ from python_code compiled here: it is not this python_code's bytecode"
    return _opaque_mismatch(compiled.opaque, found)


def _record_problem(source: str, code_hash: str, compiled: CompiledCode) -> str | None:
    """What the blob records that capture never writes for this python_code, or None."""
    problem = blob_problem(compiled)
    if problem is not None:
        return problem
    if compiled.code_hash != code_hash:
        return f"it records the python_code it was compiled from as sha256 {compiled.code_hash}, not {code_hash}"
    if compiled.filename != code_filename(code_hash):
        return f"it was compiled as {compiled.filename!r}, python_code's bytecode is compiled as {code_filename(code_hash)!r}"
    if compiled.marshal_version != MARSHAL_VERSION or compiled.flags & ~code_parts.PARTS != COMPILE_FLAGS:
        return (f"it records marshal version {compiled.marshal_version} and flags {compiled.flags:#x}; capture writes "
                f"version {MARSHAL_VERSION} and flags {COMPILE_FLAGS:#x} ({COMPILE_FLAGS | code_parts.PARTS:#x} a part at a time)")
    if compiled.optimize not in (0, 1, 2):
        return f"it records optimization level {compiled.optimize}; Python compiles at 0, 1 or 2"
    problem = left_out_problem(compiled) or layout_problem(compiled)
    if problem is None and compiled.part_lines:
        problem = code_parts.part_lines_problem(source, compiled.part_lines)
    return problem


def _expected(source: str, code_hash: str, compiled: CompiledCode, tree: Statements) -> tuple[bytes, OpaqueCheck | None]:
    """The sha256 of the bytes capture would store for python_code, and what the opaque-state rule finds."""
    if compiled.part_lines:  # a part at a time: no more than a part's code held (code_parts.digest_of)
        modules, found = modules_and_opaque(source, tree, compiled.optimize)
        codes = code_parts.compiled_parts(source, compiled.filename, COMPILE_FLAGS, compiled.optimize, compiled.part_lines)
        return code_parts.digest_of(codes, len(compiled.part_lines), modules), found
    code, found = expected_code(source, code_hash, tree, compiled.optimize, compiled.left_out)
    return hashlib.sha256(code).digest(), found


def _opaque_mismatch(recorded: OpaqueCheck | None, found: OpaqueCheck | None) -> str | None:
    if recorded != found:
        return (f"it records what load's opaque-state rule finds in python_code as {_opaque_text(recorded)}, but the rule "
                f"finds {_opaque_text(found)}: load running it would not apply the rule as it applies it to python_code")
    return None


def _unprovable_left_out(source: str, compiled: CompiledCode, tree: ast.Module) -> str | None:
    allowed = left_out_literals(source, tree)
    readable = [name for name in compiled.left_out if name not in allowed]
    if readable:
        return (f"it leaves out {listed_names(tuple(readable))}, which python_code does not assign once as a literal or names "
                "elsewhere: what load would run differs from python_code")
    return None


def _opaque_text(check: OpaqueCheck | None) -> str:
    """A record of the opaque-state rule's findings, for a message: its counts and a digest of it."""
    if check is None:
        return "nothing (python_code names no opaque part)"
    digest = hashlib.sha256(msgspec.msgpack.encode(check)).hexdigest()[:12]
    labels = "no marshalled code" if check.labels is None else f"{len(check.labels)} labelled marshalled code objects"
    return f"{len(check.problems)} problems and {labels} (record {digest})"
