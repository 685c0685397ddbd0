"""Framing of the cache file, header first.

    magic (8 bytes) | header length (u32 little endian) | header: msgpack of the tagged envelope
                    | payload: one zstd frame holding the bundle files concatenated in index order

The header alone answers `show` and `verify`; the payload is read only when a bundle is primed or
extracted, and its declared sizes are checked before anything is allocated.
"""
from __future__ import annotations

import hashlib
import os
import struct

import msgspec
import zstandard

from precompile.artifact.bundle_rules import bundle_problem
from precompile.artifact.envelope import (
    FORMAT_VERSION,
    BundleFile,
    CacheEnvelope,
    EnvelopeTag,
    KernelBundle,
)
from precompile.errors import CacheFormatError, PrecompileError

MAGIC = b"\x89PCACHE\n"
_LENGTH = struct.Struct("<I")
PREFIX_SIZE = len(MAGIC) + _LENGTH.size
MAX_HEADER_SIZE = 64 * 1024 * 1024
MAX_PAYLOAD_SIZE = 8 * 1024 * 1024 * 1024
"""The most a payload may declare whatever the user allows: what the stored sizes can express here."""
PAYLOAD_LIMIT_VAR = "PRECOMPILE_MAX_PAYLOAD_BYTES"
DEFAULT_PAYLOAD_LIMIT = 4 * 1024 * 1024 * 1024
"""The uncompressed payload a reader accepts unless PRECOMPILE_MAX_PAYLOAD_BYTES raises it."""
MAX_EXPANSION = 200
EXPANSION_FLOOR = 64 * 1024 * 1024
"""A payload may decompress to at most MAX_EXPANSION times its stored size (compiled kernels
compress a few times, not thousands: a zstd bomb does), or to EXPANSION_FLOOR, whichever is more."""
ZSTD_LEVEL = 10
HEADER_DIGEST_FIELD = "header_sha256"

_decoder = msgspec.msgpack.Decoder(CacheEnvelope)
_tag_decoder = msgspec.msgpack.Decoder(EnvelopeTag)
_fields_decoder = msgspec.msgpack.Decoder(dict)
_encoder = msgspec.msgpack.Encoder()


def header_digest(header: bytes | memoryview) -> str:
    """sha256 of a msgpack header's fields other than `header_sha256`, in the order written.

    Computed from the header as decoded generically, so fields a newer producer added (which this
    reader's Structs drop) are covered too.
    """
    fields = _fields_decoder.decode(header)
    fields.pop(HEADER_DIGEST_FIELD, None)
    return hashlib.sha256(_encoder.encode(fields)).hexdigest()


def _sealed_as_encoded(envelope: CacheEnvelope, data: bytes, end: int, digest: str) -> bool:
    """Whether the header `data[PREFIX_SIZE:end]`, less its `header_sha256` entry, hashes to `digest`
    as it is, where the header is exactly what this precompile's encoder writes for `envelope` (no unknown, duplicate or
    otherwise spelled field): a generic decode would re-encode it to the same bytes, so that
    `header_digest` need not decode and re-encode the fields (a copy of the bytecode and metadata
    blobs each). Any other header is left to `header_digest`, which defines the digest."""
    encoded = _encoder.encode(envelope)
    entry = _encoder.encode(HEADER_DIGEST_FIELD) + _encoder.encode(digest)
    at = encoded.find(entry)
    written = len(encoded) == end - PREFIX_SIZE and data.startswith(encoded, PREFIX_SIZE)  # compared as bytes: memcmp
    if not written or at <= 0 or encoded[0] & 0xF0 != 0x80:  # a msgpack fixmap, the entry inside it
        return False
    hashed = hashlib.sha256(bytes([encoded[0] - 1]))
    hashed.update(memoryview(encoded)[1:at])
    hashed.update(memoryview(encoded)[at + len(entry):])
    return hashed.hexdigest() == digest


def encode_cache(envelope: CacheEnvelope, payload: bytes = b"") -> bytes:
    """Frame `envelope`, sealed with its header digest, and its compressed bundle payload (from
    `build_bundle`) into cache bytes."""
    unsealed = msgspec.structs.replace(envelope, header_sha256="")
    sealed = msgspec.structs.replace(envelope, header_sha256=header_digest(_encoder.encode(unsealed)))
    header = _encoder.encode(sealed)
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
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CacheFormatError(f"{source} has an unreadable header: {_reason(exc)}") from None
    if tag.format_version > FORMAT_VERSION:
        raise CacheFormatError(
            f"{source} has format version {tag.format_version}, newer than this precompile understands "
            f"(up to {FORMAT_VERSION}); upgrade precompile to read it"
        )
    if tag.format_version < 1:
        raise CacheFormatError(
            f"{source} has format version {tag.format_version}, which no precompile ever wrote (versions are 1 to "
            f"{FORMAT_VERSION}); it is not a cache precompile wrote: capture again"
        )
    try:
        envelope = _decoder.decode(header)
        sealed = envelope.header_sha256
        recorded = sealed and (sealed if _sealed_as_encoded(envelope, data, end, sealed) else header_digest(header))
    except msgspec.ValidationError as exc:
        raise CacheFormatError(f"{source} has an invalid header: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CacheFormatError(f"{source} has an unreadable header: {_reason(exc)}") from None
    if recorded and recorded != envelope.header_sha256:
        raise CacheFormatError(
            f"{source} header does not match its header_sha256 (recorded {envelope.header_sha256}, computed {recorded}): "
            "a field of the header was changed after it was written; capture again"
        )
    problem = bundle_problem(envelope.bundle) if envelope.bundle is not None else None
    if problem is not None:
        raise CacheFormatError(f"{source} has a kernel bundle that cannot be trusted: {problem}. Capture again")
    return envelope, end


def _reason(exc: BaseException) -> str:
    return "it nests values too deeply to read" if isinstance(exc, RecursionError) else str(exc)


def payload_limit() -> int:
    """The most uncompressed payload bytes a reader accepts: PRECOMPILE_MAX_PAYLOAD_BYTES, else the default."""
    configured = os.environ.get(PAYLOAD_LIMIT_VAR, "").strip()
    if not configured:
        return DEFAULT_PAYLOAD_LIMIT
    try:
        value = int(configured)
    except ValueError:
        raise PrecompileError(f"{PAYLOAD_LIMIT_VAR}={configured!r} is not a number of bytes; set it to an integer or unset it") from None
    return min(max(value, 0), MAX_PAYLOAD_SIZE)


def payload_problem(bundle: KernelBundle, data: bytes, offset: int) -> str | None:
    """Why the payload cannot be trusted against its index, or None when its sizes are consistent."""
    declared = sum(entry.size for entry in bundle.files)
    if declared != bundle.payload_size:
        return f"its index adds up to {declared} bytes but declares a {bundle.payload_size}-byte payload"
    limit = payload_limit()
    if bundle.payload_size > limit:
        return (f"it declares a {bundle.payload_size}-byte payload, over the {limit}-byte limit "
                f"(set {PAYLOAD_LIMIT_VAR} to raise it, up to {MAX_PAYLOAD_SIZE})")
    stored = len(data) - offset
    if stored != bundle.payload_compressed_size:
        return f"it declares {bundle.payload_compressed_size} compressed payload bytes but {stored} are stored"
    if bundle.payload_size > max(EXPANSION_FLOOR, MAX_EXPANSION * stored):
        return (f"its {stored} stored bytes would decompress to {bundle.payload_size}, more than {MAX_EXPANSION} times "
                "their size: compiled kernels never compress that well (a decompression bomb?)")
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
