"""Framing of the cache file, header first.

    magic (8 bytes) | header length (u32 little endian) | header: msgpack of the tagged envelope
                    | payload: one zstd frame holding the bundle files concatenated in index order

The header alone answers `show` and `verify`; the payload is read only when a bundle is primed or
extracted, and its declared sizes are checked before anything is allocated.
"""
from __future__ import annotations

import hashlib
import struct

import msgspec
import zstandard

from precompile.errors import PrecompileError
from precompile.schema.envelope import (
    FORMAT_VERSION,
    BundleFile,
    CacheEnvelope,
    EnvelopeTag,
    KernelBundle,
)

MAGIC = b"\x89PCACHE\n"
_LENGTH = struct.Struct("<I")
PREFIX_SIZE = len(MAGIC) + _LENGTH.size
MAX_HEADER_SIZE = 64 * 1024 * 1024
MAX_PAYLOAD_SIZE = 8 * 1024 * 1024 * 1024
ZSTD_LEVEL = 10

_decoder = msgspec.msgpack.Decoder(CacheEnvelope)
_tag_decoder = msgspec.msgpack.Decoder(EnvelopeTag)
_encoder = msgspec.msgpack.Encoder()


class CacheFormatError(PrecompileError):
    """The cache file is not a readable envelope of a version this reader understands.

    `load` degrades on it (the cache is only an acceleration); inspect reports it.
    """


def encode_cache(envelope: CacheEnvelope, payload: bytes = b"") -> bytes:
    """Frame `envelope` and its compressed bundle payload (from `build_bundle`) into cache bytes."""
    header = _encoder.encode(envelope)
    return MAGIC + _LENGTH.pack(len(header)) + header + payload


def build_bundle(
    files: dict[str, tuple[str, bytes]],
    keys: dict[str, str],
    kernels: dict[str, str] | None = None,
    provenance: dict[str, str] | None = None,
) -> tuple[KernelBundle, bytes]:
    """Index `files` ({relative path: (kind, bytes)}) in sorted path order and compress them.

    Returns the bundle index and the compressed payload to pass to `encode_cache`.
    """
    entries = []
    blobs = []
    for path in sorted(files):
        kind, data = files[path]
        entries.append(BundleFile(path=path, kind=kind, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
        blobs.append(data)
    blob = b"".join(blobs)
    compressed = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(blob) if blob else b""
    bundle = KernelBundle(
        files=tuple(entries),
        keys=dict(sorted(keys.items())),
        payload_size=len(blob),
        payload_compressed_size=len(compressed),
        payload_sha256=hashlib.sha256(compressed).hexdigest() if compressed else "",
        kernels=dict(sorted((kernels or {}).items())),
        provenance=dict(sorted((provenance or {}).items())),
    )
    return bundle, compressed


def decode_header(data: bytes, *, source: str = "cache") -> tuple[CacheEnvelope, int]:
    """Decode the envelope without touching the payload; return it and the payload's offset."""
    if len(data) < PREFIX_SIZE or not data.startswith(MAGIC):
        raise CacheFormatError(f"{source} is not a precompile cache file (its first bytes are not the precompile magic)")
    (header_size,) = _LENGTH.unpack_from(data, len(MAGIC))
    if header_size > MAX_HEADER_SIZE:
        raise CacheFormatError(f"{source} declares a {header_size}-byte header, over the {MAX_HEADER_SIZE}-byte limit")
    end = PREFIX_SIZE + header_size
    if len(data) < end:
        raise CacheFormatError(f"{source} is truncated: its header needs {header_size} bytes, {len(data) - PREFIX_SIZE} are present")
    header = memoryview(data)[PREFIX_SIZE:end]
    try:
        tag = _tag_decoder.decode(header)
    except msgspec.DecodeError as exc:
        raise CacheFormatError(f"{source} has an unreadable header: {exc}") from None
    if tag.format_version > FORMAT_VERSION:
        raise CacheFormatError(
            f"{source} has format version {tag.format_version}, newer than this precompile understands "
            f"(up to {FORMAT_VERSION}); upgrade precompile to read it"
        )
    try:
        envelope = _decoder.decode(header)
    except msgspec.ValidationError as exc:
        raise CacheFormatError(f"{source} has an invalid header: {exc}") from None
    except msgspec.DecodeError as exc:
        raise CacheFormatError(f"{source} has an unreadable header: {exc}") from None
    return envelope, end


def payload_problem(bundle: KernelBundle, data: bytes, offset: int) -> str | None:
    """Why the payload cannot be trusted against its index, or None when its sizes are consistent."""
    declared = sum(entry.size for entry in bundle.files)
    if declared != bundle.payload_size:
        return f"its index adds up to {declared} bytes but declares a {bundle.payload_size}-byte payload"
    if bundle.payload_size > MAX_PAYLOAD_SIZE:
        return f"it declares a {bundle.payload_size}-byte payload, over the {MAX_PAYLOAD_SIZE}-byte limit"
    stored = len(data) - offset
    if stored != bundle.payload_compressed_size:
        return f"it declares {bundle.payload_compressed_size} compressed payload bytes but {stored} are stored"
    return None


def decode_payload(bundle: KernelBundle, data: bytes, offset: int, *, source: str = "cache") -> dict[str, bytes]:
    """Decompress and verify the bundle files; sizes are checked before anything is allocated."""
    problem = payload_problem(bundle, data, offset)
    if problem is not None:
        raise CacheFormatError(f"{source} bundle cannot be used: {problem}")
    if not bundle.files:
        return {}
    compressed = memoryview(data)[offset:]
    if hashlib.sha256(compressed).hexdigest() != bundle.payload_sha256:
        raise CacheFormatError(f"{source} bundle payload does not match its recorded sha256 {bundle.payload_sha256}")
    try:
        params = zstandard.get_frame_parameters(compressed)
        if params.content_size != bundle.payload_size:
            raise CacheFormatError(
                f"{source} bundle payload frame holds {params.content_size} bytes, its index declares {bundle.payload_size}"
            )
        blob = zstandard.ZstdDecompressor().decompress(compressed, max_output_size=bundle.payload_size)
    except zstandard.ZstdError as exc:
        raise CacheFormatError(f"{source} bundle payload does not decompress: {exc}") from None
    if len(blob) != bundle.payload_size:
        raise CacheFormatError(f"{source} bundle payload decompressed to {len(blob)} bytes, {bundle.payload_size} declared")
    files = {}
    position = 0
    for entry in bundle.files:
        content = blob[position : position + entry.size]
        position += entry.size
        if hashlib.sha256(content).hexdigest() != entry.sha256:
            raise CacheFormatError(f"{source} bundle file {entry.path} does not match its sha256 {entry.sha256}")
        files[entry.path] = content
    return files
