"""The line ranges of the code a capture ran, and the file hashes that let load pass a module's
ranges without reading its lines.

Dynamo records a sha256 per inlined function's line range; a MakeFx trace's ranges are the functions
it ran (`ran_sources`), recorded alike. load used to read and hash every range
of every module (20-odd library files for a transformers model). Capture adds, per module, a sha256
of its source file's bytes, but only after hashing every recorded range against exactly those bytes,
decoded as `linecache` decodes them: a file that still has them at load needs no range read.

Where the file's lines are its bytes decoded as UTF-8, the hash covers only the byte spans of the
inlined ranges and of the first two lines, where an encoding declaration would be (a transformers
model inlines a tenth of the 1 MB its 20-odd files hold), so load reads and hashes those spans
instead of whole files. An edit outside them passes as well, including one that moves the inlined
lines to other line numbers while leaving their bytes where they were: the code is the same text,
and its line numbers show only in tracebacks. Any other edit hashes the ranges line by line.
"""

import hashlib
import importlib.machinery
import inspect
import io
import itertools
import sys
import tokenize
import types
from collections.abc import Iterable, Sequence

import msgspec

from precompile.artifact.metadata import InlinedFile, InlinedSource
from precompile.codegen.drivers.source_checks import (
    code_tokens_sha256,
    function_spans,
    hash_source_lines,
    hash_spans,
    module_source_lines,
    source_file,
)
from precompile.errors import CaptureRefused, PrecompileError


def ran_sources(codes: dict[types.CodeType, str]) -> tuple[InlinedSource, ...]:
    """The line range and sha256 of each code object a MakeFx trace ran (-> its module's name),
    hashed as load hashes it: the graph baked in what that code computed. Code of __main__ (no other
    process imports it), code whose file is not its module's (exec'd with its globals) and code
    whose source cannot be read are not recorded; a module whose file no longer compiles to the code
    that ran (edited after import, as in a notebook) is a CaptureRefused."""
    found = set()
    compiled: dict[str, dict | None] = {}
    for code, module in codes.items():
        try:
            if module == "__main__" or inspect.getsourcefile(code) != source_file(module):
                continue
            lines = module_source_lines(module, "the capture")
            block, first = inspect.getsourcelines(code)
        except (OSError, TypeError, PrecompileError):  # no source to read: nothing to check
            continue
        if module not in compiled:
            compiled[module] = _compiled(module)
        now = compiled[module]
        if now is not None and not any(_same(code, twin) for twin in now.get((_qualname(code), code.co_firstlineno), ())):
            raise CaptureRefused(
                f"module {module}'s file {source_file(module)} no longer holds the code the trace ran "
                f"({_qualname(code)}, line {code.co_firstlineno}): it changed after this process imported it, and "
                "the artifact would record its new text; capture in a fresh process (or importlib.reload the "
                "module and build the model again)")
        found.add(InlinedSource(module=module, first_line=first, last_line=first + len(block),
                                sha256=hash_source_lines(lines, first, first + len(block))))
    return identified_sources(sorted(found, key=lambda s: (s.module, s.first_line, s.last_line)))


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _compiled(module: str) -> dict | None:
    """{(qualified name, first line): [code objects]} of module's file compiled now, as import compiles
    it (two lambdas on one line share a key); None where import did not read it so (pytest's assertion
    rewriting, a zip archive, an extension)."""
    loaded = sys.modules.get(module)
    path = source_file(module)
    if path is None or type(getattr(loaded, "__loader__", None)) is not importlib.machinery.SourceFileLoader:
        return None
    try:
        with open(path, "rb") as file:
            pending = [compile(file.read(), path, "exec", dont_inherit=True)]
    except (OSError, SyntaxError, ValueError):
        return None
    codes: dict[tuple[str, int], list[types.CodeType]] = {}
    while pending:
        code = pending.pop()
        codes.setdefault((_qualname(code), code.co_firstlineno), []).append(code)
        pending += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return codes


def _same(code: types.CodeType, compiled: types.CodeType) -> bool:
    """Whether the code the trace ran is what its file compiles to now (bytecode, names, constants)."""
    def constants(c: types.CodeType) -> list:
        return [k for k in c.co_consts if not isinstance(k, types.CodeType)]

    return (code.co_code, code.co_names, constants(code)) == (compiled.co_code, compiled.co_names, constants(compiled))


def identified_sources(sources: Iterable[InlinedSource]) -> tuple[InlinedSource, ...]:
    """Each range with what identifies its code apart from where it sits, read from its module's source
    (parsed once per module): the qualified name of the function it is (`Block.forward`), where a def of
    its module spans exactly its lines, and which of the module's defs of that name it is (a property's
    getter and setter share one; load finds it where a release moved it, refuses where another def of
    the name was added, and names it), or else at how many places its text sits (a lambda's line);
    and the sha256 of its tokens, by which load passes a comment or spacing edit. A range whose lines no
    longer hash as recorded (edited since Dynamo read them) gets none of these."""
    modules: dict[str, tuple[list[str], dict[tuple[int, int], tuple[str, int, int]]]] = {}
    identified = []
    for source in sources:
        if source.module not in modules:
            try:
                lines = module_source_lines(source.module, "the capture")
            except (OSError, TypeError, PrecompileError):  # no source to read: nothing to add
                lines = []
            modules[source.module] = (lines, {span: (name, place, len(spans)) for name, spans in function_spans(lines).items()
                                              for place, span in enumerate(spans)})
        lines, defs = modules[source.module]
        first, last = source.first_line, source.last_line
        if not lines or hash_source_lines(lines, first, last) != source.sha256:
            identified.append(source)
            continue
        tokens = code_tokens_sha256("".join(lines[first - 1 : last - 1])) or ""
        if (first, last) in defs:
            name, place, count = defs[first, last]
            identified.append(msgspec.structs.replace(source, function=name, place=place, same_named=count - 1,
                                                      token_sha256=tokens))
        else:
            copies = sum(hash_source_lines(lines, start, start + last - first) == source.sha256
                         for start in range(1, len(lines) - (last - first) + 2))
            identified.append(msgspec.structs.replace(source, copies=copies, token_sha256=tokens))
    return tuple(identified)


def _decoded_lines(data: bytes) -> list[str]:
    """The lines `linecache` would hold for a file with these bytes (tokenize.open's decoding)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return io.TextIOWrapper(io.BytesIO(data), encoding, line_buffering=True).readlines()


def inlined_files(sources: Iterable[InlinedSource]) -> tuple[InlinedFile, ...]:
    """One InlinedFile per module whose file proves all of its ranges; modules whose file cannot be
    read, or whose ranges do not hash as recorded (edited since Dynamo read it), get none, and
    load hashes their ranges one by one."""
    ranges: dict[str, list[InlinedSource]] = {}
    for source in sources:
        ranges.setdefault(source.module, []).append(source)
    files = []
    for module, recorded in sorted(ranges.items()):
        path = None if module == "__main__" else source_file(module)
        if path is None:
            continue
        try:
            with open(path, "rb") as file:
                data = file.read()
            lines = _decoded_lines(data)
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        if all(hash_source_lines(lines, s.first_line, s.last_line) == s.sha256 for s in recorded):
            files.append(_proof(module, data, lines, recorded))
    return tuple(files)


def _proof(module: str, data: bytes, lines: list[str], recorded: Sequence[InlinedSource]) -> InlinedFile:
    """The hash of the ranges' byte spans where lines and bytes agree (UTF-8 throughout, every range
    within the file), else of the whole file. The first two lines are always a span: an encoding
    declaration there decides what every other byte means."""
    if "".join(lines).encode() != data or not all(
            1 <= s.first_line <= s.last_line <= len(lines) + 1 for s in recorded):
        return InlinedFile(module=module, sha256=hashlib.sha256(data).hexdigest())
    starts = list(itertools.accumulate((len(line.encode()) for line in lines), initial=0))
    spans = tuple(sorted({(0, starts[min(2, len(lines))])} | {(starts[s.first_line - 1], starts[s.last_line - 1]) for s in recorded}))
    return InlinedFile(module=module, sha256=hash_spans(data, spans), spans=spans)
