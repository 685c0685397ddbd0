"""The file hashes that let load pass a module's inlined ranges without reading its lines.

Dynamo records a sha256 per inlined function's line range; load used to read and hash every range
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
import io
import itertools
import tokenize
from collections.abc import Iterable, Sequence

from precompile.artifact.metadata import InlinedFile, InlinedSource
from precompile.codegen.drivers.dynamo_checks import hash_source_lines, hash_spans, source_file


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
