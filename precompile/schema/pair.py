"""Read an artifact pair from disk without executing or unpickling anything: the half of `load`
that inspect shares. Torch-free."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from precompile.errors import PrecompileError
from precompile.schema.codec import CacheFormatError, decode_header
from precompile.schema.envelope import CacheEnvelope
from precompile.schema.metadata import ArtifactMetadata
from precompile.schema.pycode import MAX_PYTHON_CODE_SIZE, code_hash, decode_source, parse_metadata, parse_source


@dataclass(frozen=True)
class PythonCode:
    path: Path
    data: bytes
    source: str
    metadata: ArtifactMetadata
    tree: ast.Module | None = None
    """The syntax tree the metadata was read from, which load compiles (None where only the metadata
    was wanted)."""

    @property
    def code_hash(self) -> str:
        return code_hash(self.data)


@dataclass(frozen=True)
class CacheFile:
    """A cache file read header-first. `envelope` is None when it is not a usable envelope."""

    path: Path
    data: bytes
    envelope: CacheEnvelope | None
    payload_offset: int
    problem: str | None
    """Why the cache cannot be used (unreadable, other format, newer version), or None."""


def read_bytes(path: Path, what: str, limit: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise PrecompileError(f"{what} {path} is {size} bytes, over the {limit}-byte limit for a precompile artifact")
        return path.read_bytes()
    except PrecompileError:
        raise
    except IsADirectoryError:
        raise PrecompileError(f"{what} {path} is a directory, not a file; pass the file capture() wrote") from None
    except FileNotFoundError:
        raise PrecompileError(f"{what} {path} does not exist; pass the path capture() wrote") from None
    except OSError as exc:
        raise PrecompileError(f"could not read {what} {path}: {exc.strerror or exc}") from None


def read_python_code(path: Path) -> PythonCode:
    data = read_bytes(path, "python_code", MAX_PYTHON_CODE_SIZE)
    source = decode_source(data, filename=str(path))
    tree = parse_source(source, filename=str(path))
    return PythonCode(path=path, data=data, source=source, metadata=parse_metadata(tree, filename=str(path)), tree=tree)


def parse_cache(path: Path, data: bytes) -> CacheFile:
    try:
        envelope, offset = decode_header(data, source=f"cache {path}")
    except CacheFormatError as exc:
        return CacheFile(path=path, data=data, envelope=None, payload_offset=0, problem=str(exc))
    return CacheFile(path=path, data=data, envelope=envelope, payload_offset=offset, problem=None)


def read_cache(path: Path, limit: int) -> CacheFile:
    """Read a cache file; a missing or unreadable file is a problem to report, not an exception."""
    try:
        data = read_bytes(path, "cache", limit)
    except PrecompileError as exc:
        return CacheFile(path=path, data=b"", envelope=None, payload_offset=0, problem=str(exc))
    return parse_cache(path, data)


def declared_code_hash(data: bytes) -> str | None:
    """The code_hash a cache's bytes declare, or None if they are not a readable envelope."""
    try:
        envelope, _ = decode_header(data)
    except CacheFormatError:
        return None
    return envelope.code_hash


def pairing_problem(python_code: PythonCode, envelope: CacheEnvelope) -> str | None:
    """Why this cache does not belong to this python_code (fatal at load), or None."""
    meta = python_code.metadata
    if envelope.backend != meta.backend:
        return f"the cache's backend {envelope.backend!r} does not match the python_code BACKEND {meta.backend!r}"
    tracer = type(meta).__struct_config__.tag
    if envelope.tracer != tracer:
        return f"the cache's tracer {envelope.tracer!r} does not match the python_code TRACER {tracer!r}"
    if envelope.code_hash != python_code.code_hash:
        return f"the cache's code_hash {envelope.code_hash} does not match sha256(python_code) {python_code.code_hash}"
    return None

