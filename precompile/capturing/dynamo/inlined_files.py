"""The whole-file hashes that let load pass a module's inlined ranges without reading its lines.

Dynamo records a sha256 per inlined function's line range; load used to read and hash every range
of every module (20-odd library files for a transformers model). Capture adds the sha256 of each
module's source file bytes, but only after hashing every recorded range against exactly those
bytes, decoded as `linecache` decodes them: a file that still has them at load needs no range read.
"""

import hashlib
import io
import tokenize
from collections.abc import Iterable

from precompile.artifact.metadata import InlinedFile, InlinedSource
from precompile.codegen.drivers.dynamo import hash_source_lines, source_file


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
            files.append(InlinedFile(module=module, sha256=hashlib.sha256(data).hexdigest()))
    return tuple(files)
