"""What capture does once so that load need not: python_code compiled to bytecode, and its metadata
literals decoded into typed msgpack, both carried in the cache header beside the envelope's fields.

The bytecode is kept the way a hash-checked `.pyc` keeps it (PEP 552): it is keyed by the exact
python_code it was compiled from (the envelope's `code_hash`) and by the interpreter's magic number,
and a reader whose interpreter, flags or optimization level differ compiles the source instead.
python_code stays the single source of truth, runnable alone.

Compilation is made reproducible so that `verify` can PROVE the bytecode is python_code's by
compiling the source again and comparing bytes, never by loading the stored ones:

- the filename compiled in is `code_filename(code_hash)`, fixed by the content (load renames every
  code object to the file's real path as it unmarshals them, so tracebacks and linecache are as
  before: `renamed`);
- the compiler flags are fixed (`COMPILE_FLAGS`: `from __future__ import annotations`, which load
  always compiled python_code with, inherited from its own module), never inherited;
- marshal format version 2, which writes no back-references: versions 3 and up mark an object
  shared when its reference count in the producing process is above one, so the same code object
  marshals to different bytes in different processes.

python_code over code_parts.WHOLE_MAX_CHARS (1 MiB) is stored a part at a time, one module code
object a run of top-level statements, run in turn (artifact/code_parts.py): compiling it whole for the
proof would take 37 to 150 bytes a byte of it, a part at a time the memory of a part.

A Dynamo artifact lowered with Inductor carries each subgraph's output module as a string that its
dynamo_subgraphs driver compiles at load (`inductor_subgraph(name, text)`); those are compiled at
capture too, so the stored bytes are `marshal.dumps((code, modules), 2)` where `modules` maps the
sha256 of each such text to its code, compiled as the driver names it (`<precompile subgraph NAME>`).

Every statement is compiled. Caches written before left out the metadata literals no code in
python_code names (`LEFT_OUT`, recorded in the blob's `left_out`: a Dynamo artifact's SUMMARY and
GUARDS, about half of what load unmarshalled); load no longer runs such bytecode, since python_code
could look the name up as it runs (`bytes.fromhex(...).decode() in globals()`), which no proof over
its text rules out, and act otherwise under load than as printed. verify still proves them.

The metadata is `msgspec.msgpack` of the typed metadata converted from python_code's literals, so
`verify` can decode it (msgspec decoding runs nothing) and compare it with the literals it parses.

Both are stored as one zstd frame each (marshalled code compresses about 14 times, the metadata
about 35): the header stays small, so decoding it and checking its digest stays cheap. Their
recorded sha256 is of the stored bytes; they decompress to at most their recorded size.

Torch-free: `compile()` needs no torch, and nothing here executes or unmarshals anything.
"""
from __future__ import annotations
import __future__

import ast
import copy
import hashlib
import importlib.util
import marshal
import sys
import types
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
import zstandard

from precompile.artifact import code_parts, opaque_state
from precompile.artifact.envelope import CompiledCode, EncodedMetadata, OpaqueCheck
from precompile.artifact.metadata import ArtifactMetadata, MetadataHeader
from precompile.artifact.pycode import code_lines

MARSHAL_VERSION = 2
COMPILE_FLAGS = __future__.annotations.compiler_flag
OPTIMIZE = 0
"""The optimization level capture compiles at; a process run with -O or -OO compiles the source."""
MAX_PREPARED_SIZE = 256 * 1024 * 1024
"""The most bytecode or metadata (uncompressed) a cache carries: past it, capture leaves them out
(load compiles and parses python_code as before) and readers refuse to decompress them."""
MAX_STORED_SIZE = 32 * 1024 * 1024
"""The most both compressed blobs may take of the header (whose limit is 64 MiB)."""
ZSTD_LEVEL = 3
LEFT_OUT = ("SUMMARY", "GUARDS")
"""The metadata literals caches written before left out of their bytecode, as no code in python_code
names them: verify still proves such a blob, load runs none (see left_out_reason)."""



@dataclass(frozen=True)
class PartFacts:
    """What one part of python_code (top-level statements) gives expected_code, decided by its text
    alone, lines counted from its first: the Inductor modules it embeds ({sha256: (filename, text)}
    items) and its statements that name an opaque part (never changed: expected_code moves copies)."""

    embedded: tuple[tuple[str, tuple[str, str]], ...]
    opaque: tuple[ast.stmt, ...]


Statements = ast.Module | Iterable[tuple[ast.Module | PartFacts, int]]
"""python_code's syntax tree, or its parts in file order, each with the line of the file it starts
at (inspect/parsing/chunked_parse.py), as trees or as the facts `part_facts` takes from them: no tree of the
whole file is then held."""

_metadata_encoder = msgspec.msgpack.Encoder()
_metadata_decoder = msgspec.msgpack.Decoder(ArtifactMetadata)
_header_decoder = msgspec.msgpack.Decoder(MetadataHeader)


def magic() -> str:
    """This interpreter's bytecode magic number, as the envelope records it (hex)."""
    return importlib.util.MAGIC_NUMBER.hex()


def code_filename(code_hash: str) -> str:
    """The filename python_code is compiled under for its stored bytecode: fixed by its content."""
    return f"<precompile python_code {code_hash[:12]}>"


def renamed(data: bytes, code_hash: str, filename: str) -> bytes:
    """Stored bytecode (decompressed) whose code objects, once unmarshalled, carry `filename` instead
    of `code_filename(code_hash)`. Marshal format 2 writes every string whole ("u", its UTF-8 length
    in 4 bytes, its UTF-8) and refers back to none, so each code object's copy of the name is one
    run of bytes to replace, and unmarshalling builds the code objects renamed (renaming them after
    with `code.replace` costs a copy of every code object: milliseconds for a large Dynamo guard).
    A string constant equal to that name would be renamed too: python_code would have to spell out
    the sha256 of its own text for that."""
    def token(text: str) -> bytes:
        encoded = text.encode("utf-8", "surrogatepass")
        return b"u" + len(encoded).to_bytes(4, "little") + encoded

    return data.replace(token(code_filename(code_hash)), token(filename))


def compile_python_code(source: str | ast.Module, filename: str, optimize: int = OPTIMIZE) -> types.CodeType:
    """python_code (its text or its syntax tree) compiled as load runs it: flags fixed, none inherited."""
    return compile(source, filename, "exec", flags=COMPILE_FLAGS, dont_inherit=True, optimize=optimize)


def embedded_modules(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """{sha256 of the text: (filename, text)} of every top-level `NAME = inductor_subgraph("name",
    "text", ...)` in python_code (string literals both), in order: the modules its driver compiles,
    which is where precompile renders them (a module found nowhere else is compiled when it runs)."""
    modules: dict[str, tuple[str, str]] = {}
    for statement in tree.body:
        found = _embedded_module(statement)
        if found is not None:
            modules.setdefault(*found)
    return modules


def _embedded_module(statement: ast.stmt) -> tuple[str, tuple[str, str]] | None:
    node = statement.value if isinstance(statement, ast.Assign) else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "inductor_subgraph"
            and len(node.args) >= 2):
        return None
    name, text = (arg.value if isinstance(arg, ast.Constant) else None for arg in node.args[:2])
    if not (isinstance(name, str) and isinstance(text, str)):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), (f"<precompile subgraph {name}>", text)


def whole_tree(tree: Statements) -> ast.Module:
    """The syntax tree of the whole file from its parts (line numbers made the file's)."""
    if isinstance(tree, ast.Module):
        return tree
    body: list[ast.stmt] = []
    for part, first_line in tree:
        if isinstance(part, PartFacts):
            raise TypeError("the whole tree is built from the parts' trees, not from their facts")
        body.extend(ast.increment_lineno(part, first_line - 1).body if first_line > 1 else part.body)
    return ast.Module(body=body, type_ignores=[])


def left_out_literals(source: str, tree: ast.Module) -> tuple[str, ...]:
    """The names of LEFT_OUT that python_code (`source`, parsed as `tree`) may be compiled without, in
    LEFT_OUT's order: each bound by exactly one top-level statement whose value is a plain literal
    (leaving it out skips no side effect), and spelled nowhere else in the text, nor in any string or
    bytes constant, compared after NFKC folding (as identifiers are). A name computed at run time
    (`vars()["SUMM" + "ARY"]`, bytes decoded by another codec) is beyond this proof; precompile
    writes none."""
    bound = {}
    for name in LEFT_OUT:
        assignments = [statement for statement in tree.body if isinstance(statement, ast.Assign) and _literal_name(statement) == name]
        if len(assignments) == 1 and _is_literal(assignments[0].value):
            bound[name] = assignments[0]
    lines = code_lines(source) if bound else []
    for name, assignment in list(bound.items()):
        first, last = assignment.lineno - 1, assignment.end_lineno or assignment.lineno
        if name in _folded("".join(lines[:first] + lines[last:])):
            del bound[name]
    # One walk of the module for every name still in question, each skipping its own assignment.
    for statement in tree.body:
        names = [name for name, assignment in bound.items() if assignment is not statement]
        for node in ast.walk(statement) if names else ():
            if isinstance(node, _NO_IDENTIFIERS):
                continue
            if isinstance(node, ast.Constant):
                texts = _constant_texts(node.value)
                spelled = [name for name in names if any(name in text for text in texts)]
            else:
                identifiers = _identifiers(node)
                spelled = [name for name in names if name in identifiers]
            for name in spelled:
                del bound[name]
                names.remove(name)
            if not names:
                break
    return tuple(name for name in LEFT_OUT if name in bound)


_NO_IDENTIFIERS = (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.expr_context)
"""Nodes with no string field, most of a listing literal's nodes: skipped without looking."""


def _constant_texts(value: object) -> list[str]:
    """What a constant could spell, folded: a string's text; a bytes constant read as Latin-1 and as
    UTF-8 (source compiled from bytes is UTF-8 by default). Other constants spell no name."""
    if isinstance(value, str):
        return [_folded(value)]
    if isinstance(value, bytes):
        return [_folded(value.decode("latin-1")), _folded(value.decode("utf-8", "replace"))]
    return []


def _identifiers(node: ast.AST) -> set[str]:
    """The identifiers a node spells (the parser folded them already): a name, an attribute, and also
    a keyword argument, a parameter, an imported name or alias, a def or class, a global: every
    string field of the node, and every string in its list fields."""
    found = set()
    for _, value in ast.iter_fields(node):
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, list):
            found.update(item for item in value if isinstance(item, str))
    return found


def _folded(text: str) -> str:
    """`text` after NFKC folding, as identifiers are compared (ASCII text folds to itself)."""
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def _is_literal(node: ast.expr) -> bool:
    """Whether `node` is built of constants (signed numbers too), tuples, lists, sets and dicts only."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_literal(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and _is_literal(key) for key in node.keys) and all(_is_literal(v) for v in node.values)
    return False


def _literal_name(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return None


def compiled_bytes(source: str, code_hash: str, tree: Statements, optimize: int = OPTIMIZE,
                   left_out: tuple[str, ...] = ()) -> bytes:
    """The bytes capture stores for python_code (`tree`, its parse) and verify recomputes:
    deterministic for one source. The top-level assignments to `left_out` are not compiled."""
    return expected_code(source, code_hash, tree, optimize, left_out)[0]


def expected_code(source: str, code_hash: str, tree: Statements, optimize: int = OPTIMIZE,
                  left_out: tuple[str, ...] = ()) -> tuple[bytes, OpaqueCheck | None]:
    """compiled_bytes, and what load's opaque-state rule finds in python_code (the record capture
    keeps beside them). `tree` may be the top-level statements alone, in file order with the file's
    line numbers (a parse a part at a time): without `left_out` they are looked at one by one and
    only those that name an opaque part are kept, so no syntax tree of the whole file is held; the
    source is compiled whole from its text (the compiler's own tree, a fraction of `ast`'s)."""
    if left_out:
        whole = whole_tree(tree)
        kept = ast.Module(body=[s for s in whole.body if _literal_name(s) not in left_out], type_ignores=whole.type_ignores)
        code = compile_python_code(kept, code_filename(code_hash), optimize)
        modules = {digest: compile_python_code(text, filename, optimize) for digest, (filename, text) in embedded_modules(whole).items()}
        return marshal.dumps((code, modules), MARSHAL_VERSION), opaque_state.checked(whole, source)
    modules, opaque = modules_and_opaque(source, tree, optimize)
    code = compile_python_code(source, code_filename(code_hash), optimize)
    return marshal.dumps((code, modules), MARSHAL_VERSION), opaque


def modules_and_opaque(source: str, tree: Statements, optimize: int) -> tuple[dict[str, types.CodeType], OpaqueCheck | None]:
    """The code of the Inductor modules python_code carries as text, by their sha256, and what load's
    opaque-state rule finds in it, from its statements looked at one by one (see expected_code)."""
    texts: dict[str, tuple[str, str]] = {}
    named = opaque_state.mentioned(source)
    opaque_statements = []
    for part, first_line in [(tree, 1)] if isinstance(tree, ast.Module) else tree:
        facts = part if isinstance(part, PartFacts) else part_facts(part, named)
        for digest, found in facts.embedded:
            texts.setdefault(digest, found)
        for statement in facts.opaque if named else ():
            opaque_statements.append(ast.increment_lineno(copy.deepcopy(statement), first_line - 1))
    opaque = opaque_state.checked(ast.Module(body=opaque_statements, type_ignores=[]), source)
    return {digest: compile_python_code(text, filename, optimize) for digest, (filename, text) in texts.items()}, opaque


def part_facts(part: ast.Module, opaque: bool) -> PartFacts:
    """The facts expected_code takes from a part's tree; its statements are walked for opaque parts
    only when `opaque` (python_code names one: opaque_state.mentioned)."""
    embedded = tuple(found for found in map(_embedded_module, part.body) if found is not None)
    return PartFacts(embedded, tuple(s for s in part.body if opaque_state.names_a_part(s)) if opaque else ())


def prepare(source: str, code_hash: str, metadata: ArtifactMetadata, tree: Statements) -> tuple[CompiledCode | None, EncodedMetadata | None]:
    """The bytecode and typed metadata a capture carries in its cache (None for each when too big):
    every statement compiled (see left_out_reason); python_code over code_parts.WHOLE_MAX_CHARS a
    part at a time, where its statements allow (artifact/code_parts.py)."""
    parts = None
    part_lines: tuple[int, ...] = ()
    if len(source) > code_parts.WHOLE_MAX_CHARS:
        parts = code_parts.capture_parts(source, code_filename(code_hash), COMPILE_FLAGS, OPTIMIZE)
    if parts is None:
        code, opaque = expected_code(source, code_hash, tree)
        flags = COMPILE_FLAGS
    else:
        modules, opaque = modules_and_opaque(source, tree, OPTIMIZE)
        code = marshal.dumps((tuple(parts[1]), modules), MARSHAL_VERSION)
        flags, part_lines = COMPILE_FLAGS | code_parts.PARTS, parts[0]
        del parts, modules
    encoded = _metadata_encoder.encode(metadata)
    if max(len(code), len(encoded)) > MAX_PREPARED_SIZE:
        return None, None
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    stored_code, stored_meta = compressor.compress(code), compressor.compress(encoded)
    if len(stored_code) + len(stored_meta) > MAX_STORED_SIZE:
        return None, None
    compiled = CompiledCode(
        code_hash=code_hash, magic=magic(), filename=code_filename(code_hash), flags=flags, optimize=OPTIMIZE,
        marshal_version=MARSHAL_VERSION, size=len(code), compressed_size=len(stored_code),
        sha256=hashlib.sha256(stored_code).hexdigest(), data=stored_code,
        opaque=opaque, part_lines=part_lines,
    )
    meta = EncodedMetadata(code_hash=code_hash, size=len(encoded), compressed_size=len(stored_meta),
                           sha256=hashlib.sha256(stored_meta).hexdigest(), data=stored_meta)
    return compiled, meta


def blob_problem(blob: CompiledCode | EncodedMetadata) -> str | None:
    """Why a blob's stored bytes are not the ones its entry records (sizes, sha256), or None."""
    if len(blob.data) != blob.compressed_size:
        return f"it holds {len(blob.data)} bytes, its entry records {blob.compressed_size}"
    if blob.size > MAX_PREPARED_SIZE:
        return f"it declares {blob.size} bytes, over the {MAX_PREPARED_SIZE}-byte limit"
    digest = hashlib.sha256(blob.data).hexdigest()
    if digest != blob.sha256:
        return f"its sha256 is {digest}, its entry records {blob.sha256}"
    return None


def decompressed(blob: CompiledCode | EncodedMetadata) -> bytes:
    """The bytes of a blob whose entry checked out (blob_problem): at most its recorded size, and
    exactly that many, else ValueError."""
    try:
        if zstandard.get_frame_parameters(blob.data).content_size != blob.size:
            raise ValueError(f"its frame does not hold the {blob.size} bytes its entry records")
        data = zstandard.ZstdDecompressor().decompress(blob.data, max_output_size=blob.size)
    except zstandard.ZstdError as exc:
        raise ValueError(f"it does not decompress: {exc}") from None
    if len(data) != blob.size:
        raise ValueError(f"it decompresses to {len(data)} bytes, its entry records {blob.size}")
    return data


def unusable_reason(compiled: CompiledCode, code_hash: str) -> str | None:
    """Why load would not run this bytecode here (it compiles python_code instead), or None.

    Only what `verify` can prove is used: bytecode of this very python_code (`code_hash`, the sha256
    of the python_code at hand), this interpreter's magic number, the fixed flags, filename and
    marshal version, the optimization level this process compiles at, and the recorded sha256."""
    if compiled.code_hash != code_hash:
        return f"it was compiled from the python_code with sha256 {compiled.code_hash}, not this one ({code_hash})"
    if compiled.magic != magic():
        return f"it was compiled by a Python with magic number {compiled.magic}, this one's is {magic()}"
    if compiled.marshal_version != MARSHAL_VERSION:
        return f"it is marshal version {compiled.marshal_version}, not {MARSHAL_VERSION}"
    if compiled.flags & ~code_parts.PARTS != COMPILE_FLAGS:
        return f"it was compiled with flags {compiled.flags:#x}, not {COMPILE_FLAGS:#x}"
    problem = layout_problem(compiled)
    if problem is not None:
        return problem
    if compiled.optimize != sys.flags.optimize:
        return f"it was compiled at optimization level {compiled.optimize}, this process runs at {sys.flags.optimize}"
    if compiled.filename != code_filename(code_hash):
        return f"it was compiled as {compiled.filename!r}, not {code_filename(code_hash)!r}"
    problem = left_out_reason(compiled)
    if problem is not None:
        return problem
    return blob_problem(compiled)


def left_out_reason(compiled: CompiledCode) -> str | None:
    """Why load does not run bytecode for what it leaves out, or None when it leaves nothing out: every
    name python_code binds is bound under load too, so that no run-time read (a name computed at run
    time looked up in globals()) can tell the cache's bytecode from python_code run as printed."""
    if not compiled.left_out:
        return None
    return left_out_problem(compiled) or (
        f"it leaves out {listed_names(compiled.left_out)}, which python_code binds (a cache written before capture "
        "compiled every statement): load runs only bytecode that binds every name python_code binds")


def left_out_problem(compiled: CompiledCode) -> str | None:
    """Why the statements the blob says it left out are not ones it may leave out, or None."""
    unknown = [name for name in compiled.left_out if name not in LEFT_OUT]
    if unknown or len(set(compiled.left_out)) != len(compiled.left_out):
        return (f"it leaves out {listed_names(compiled.left_out)}; only {listed_names(LEFT_OUT)} "
                "(literals no code in python_code reads) may be left out, each once")
    return None


def listed_names(names: tuple[str, ...], most: int = 5) -> str:
    """Names for a message: each quoted as repr quotes it, the first `most` of them."""
    shown = ", ".join(repr(name[:80]) for name in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def layout_problem(compiled: CompiledCode) -> str | None:
    """Why the blob's parts (code_parts.PARTS in its flags, its part_lines) do not go together, or None."""
    if bool(compiled.flags & code_parts.PARTS) != bool(compiled.part_lines):
        return (f"its flags ({compiled.flags:#x}) and its {len(compiled.part_lines)} part lines disagree on whether "
                "it is stored a part at a time")
    if compiled.part_lines and compiled.left_out:
        return "it is stored a part at a time and leaves literals out, which capture never wrote"
    if compiled.part_lines:
        return code_parts.shape_problem(compiled.part_lines)
    return None


def decode_metadata(encoded: EncodedMetadata, code_hash: str) -> ArtifactMetadata | None:
    """The typed metadata of an encoded blob made from the python_code with sha256 `code_hash`, whose
    bytes match its entry; None otherwise."""
    return _decoded(_metadata_decoder, encoded, code_hash)


def decode_metadata_header(encoded: EncodedMetadata, code_hash: str) -> MetadataHeader | None:
    """decode_metadata's MetadataHeader alone (its other fields are skipped, not built); None where
    decode_metadata would give None for want of these fields."""
    return _decoded(_header_decoder, encoded, code_hash)


def _decoded(decoder: msgspec.msgpack.Decoder, encoded: EncodedMetadata, code_hash: str):
    if encoded.code_hash != code_hash or blob_problem(encoded) is not None:
        return None
    try:
        return decoder.decode(decompressed(encoded))
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def metadata_problem(encoded: EncodedMetadata, code_hash: str, parsed: ArtifactMetadata) -> str | None:
    """Why the stored metadata is not the metadata literals `parsed` of the python_code with sha256
    `code_hash` (verify's proof), or None."""
    problem = blob_problem(encoded)
    if problem is not None:
        return problem
    if encoded.code_hash != code_hash:
        return f"it records the python_code it was decoded from as sha256 {encoded.code_hash}, not {code_hash}"
    try:
        decoded = _metadata_decoder.decode(decompressed(encoded))
    except ValueError as exc:
        return str(exc)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        return f"it does not decode as python_code metadata: {exc}"
    if decoded != parsed:
        return "it differs from the metadata literals of python_code: it is not this python_code's metadata"
    return None
