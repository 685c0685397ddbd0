"""Read an artifact pair from disk without executing or unpickling anything: the half of `load`
that inspect shares. Torch-free."""
from __future__ import annotations

import ast
import functools
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from precompile.artifact.bytecode import decode_metadata, decode_metadata_header
from precompile.artifact.codec import CacheFormatError, decode_header, decode_payload
from precompile.artifact.envelope import FORMAT_VERSION, CacheEnvelope, EncodedMetadata
from precompile.artifact.metadata import ArtifactMetadata, MetadataHeader, header_of
from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE, code_hash, decode_source, parse_metadata, parse_source
from precompile.errors import PrecompileError, PrecompileWarning

PENDING_SUFFIX = ".pending"
"""`<cache>.pending`: a writer's new cache between its two commit renames (see runtime/writer.py),
which `load` adopts once it passes every check a cache passes."""


def pending_path(cache_path: Path) -> Path:
    return cache_path.with_name(cache_path.name + PENDING_SUFFIX)


@dataclass(frozen=True)
class PythonCode:
    path: Path
    data: bytes
    header: MetadataHeader
    """What load acts on before python_code runs (tracer, backend, serving mode, format version, subgraphs)."""
    tree: ast.Module | None = None
    """The syntax tree the metadata was read from, which load compiles (None where only the metadata
    was wanted, or where it comes typed from the cache)."""
    encoded: EncodedMetadata | None = None
    """The paired cache's typed copy of the metadata, decoded when `metadata` is first read (a Dynamo
    artifact's guards and summary take most of its decoding, and serving reads none of them)."""

    @classmethod
    def parsed(cls, path: Path, data: bytes, source: str, metadata: ArtifactMetadata, tree: ast.Module | None = None) -> PythonCode:
        """A python_code whose metadata literals were parsed."""
        code = cls(path=path, data=data, header=header_of(metadata), tree=tree)
        code.__dict__["source"] = source
        code.__dict__["_typed"] = (metadata, False)
        return code

    @functools.cached_property
    def source(self) -> str:
        """The text: decoded when first read where the metadata came from the cache (load then runs
        the cache's bytecode, and only a traceback or debugger reads the text)."""
        return decode_source(self.data, filename=str(self.path))

    @functools.cached_property
    def code_hash(self) -> str:
        return code_hash(self.data)

    @property
    def metadata(self) -> ArtifactMetadata:
        return self._typed[0]

    @property
    def metadata_from_cache(self) -> bool:
        """Whether `metadata` was decoded from the paired cache's typed copy rather than parsed."""
        return self._typed[1]

    @functools.cached_property
    def _typed(self) -> tuple[ArtifactMetadata, bool]:
        """The metadata decoded from the cache's copy; parsed from the literals where the copy's header
        decoded but the whole does not (with a warning where that header said otherwise)."""
        if self.encoded is not None:
            decoded = decode_metadata(self.encoded, self.code_hash)
            if decoded is not None and decoded.format_version <= FORMAT_VERSION:
                return decoded, True
        tree = self.tree if self.tree is not None else parse_source(self.source, filename=str(self.path))
        parsed = parse_metadata(tree, filename=str(self.path))
        literal = header_of(parsed)
        if literal != self.header:
            warnings.warn(
                f"the cache paired with python_code {self.path} carries typed metadata that does not decode whole, and "
                f"its header ({_header_text(self.header)}) differs from python_code's literals ({_header_text(literal)}), "
                "which `metadata` now holds; load acted on the cache's header. Run `precompile verify` on the pair and "
                "capture it again",
                PrecompileWarning,
                stacklevel=2,
            )
        return parsed, False


def _header_text(header: MetadataHeader) -> str:
    return (f"tracer {header.tracer!r}, backend {header.backend!r}, serving mode {header.serving_mode!r}, "
            f"fn {header.fn_name[:80]!r}, format version {header.format_version}, {len(header.subgraphs)} subgraphs")


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
    """The bytes of a regular file (a symlink is followed to one), at most `limit` of them.

    A FIFO, device or socket is refused before it is read (opening never blocks), and the file is
    read by the size its descriptor reports, so a file that grows while read cannot exceed `limit`.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except IsADirectoryError:
        raise PrecompileError(f"{what} {path} is a directory, not a file; pass the file capture() wrote") from None
    except FileNotFoundError:
        raise PrecompileError(f"{what} {path} does not exist; pass the path capture() wrote") from None
    except OSError as exc:
        raise PrecompileError(f"could not read {what} {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(descriptor)
        if stat.S_ISDIR(info.st_mode):
            raise PrecompileError(f"{what} {path} is a directory, not a file; pass the file capture() wrote")
        if not stat.S_ISREG(info.st_mode):
            raise PrecompileError(
                f"{what} {path} is not a regular file (it is a {_file_type(info.st_mode)}); pass the file capture() wrote"
            )
        if info.st_size > limit:
            raise PrecompileError(f"{what} {path} is {info.st_size} bytes, over the {limit}-byte limit for a precompile artifact")
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            data = handle.read(info.st_size + 1)
    except OSError as exc:
        raise PrecompileError(f"could not read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(descriptor)
    if len(data) > info.st_size:
        raise PrecompileError(f"{what} {path} grew while it was read; read it again once its writer is done")
    return data


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def read_python_code(path: Path, data: bytes | None = None, *, envelope: CacheEnvelope | None = None,
                     digest: str | None = None) -> PythonCode:
    """Read (unless its bytes are given), decode and parse python_code, and its metadata literals.

    With the `envelope` of a cache that pairs with these bytes (its code_hash is their sha256,
    `digest` when already computed) and carries their metadata typed, whose bytes match their
    recorded sha256, that metadata is taken instead and nothing is parsed."""
    if data is None:
        data = read_bytes(path, "python_code", MAX_PYTHON_CODE_SIZE)
    if envelope is not None and envelope.metadata_msgpack is not None:
        digest = digest or code_hash(data)
        header = decode_metadata_header(envelope.metadata_msgpack, digest) if envelope.code_hash == digest else None
        if header is not None and header.format_version <= FORMAT_VERSION:
            code = PythonCode(path=path, data=data, header=header, encoded=envelope.metadata_msgpack)
            code.__dict__["code_hash"] = digest
            if not data.isascii():  # text that is not UTF-8 is refused here, as when it is parsed
                code.__dict__["source"] = decode_source(data, filename=str(path))
            return code
    source = decode_source(data, filename=str(path))
    tree = parse_source(source, filename=str(path))
    return PythonCode.parsed(path, data, source, parse_metadata(tree, filename=str(path)), tree)


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


def cache_problem(data: bytes, python_code: bytes, *, source: str) -> str | None:
    """Why cache bytes would not be used whole with this python_code, or None: the checks `load`
    makes of a cache (header, pairing by code_hash, payload sizes and hashes), all before any use."""
    try:
        envelope, offset = decode_header(data, source=source)
    except CacheFormatError as exc:
        return str(exc)
    if envelope.code_hash != code_hash(python_code):
        return f"{source} declares code_hash {envelope.code_hash}, not sha256(python_code) {code_hash(python_code)}"
    if envelope.bundle is not None and envelope.bundle.files:
        try:
            decode_payload(envelope.bundle, data, offset, source=source)
        except CacheFormatError as exc:
            return str(exc)
    return None


def pairing_problem(python_code: PythonCode, envelope: CacheEnvelope) -> str | None:
    """Why this cache does not belong to this python_code (fatal at load), or None."""
    header = python_code.header
    if envelope.backend != header.backend:
        return f"the cache's backend {envelope.backend!r} does not match the python_code BACKEND {header.backend!r}"
    if envelope.tracer != header.tracer:
        return f"the cache's tracer {envelope.tracer!r} does not match the python_code TRACER {header.tracer!r}"
    if envelope.code_hash != python_code.code_hash:
        return f"the cache's code_hash {envelope.code_hash} does not match sha256(python_code) {python_code.code_hash}"
    return None

