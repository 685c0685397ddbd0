"""The kernel bundle's files of a precompile cache, read from disk and hash-checked as load decodes them."""
from __future__ import annotations

from pathlib import Path

from precompile.artifact.codec import MAX_HEADER_SIZE, MAX_PAYLOAD_SIZE, PREFIX_SIZE, decode_payload
from precompile.artifact.pair import read_bytes
from precompile.inspect.model.artifact import CacheInfo


def bundle_files(cache: CacheInfo) -> dict[str, bytes]:
    """{path: bytes} of each file of the cache's kernel bundle ({} without one); raises
    CacheFormatError (a file failing its hash, a payload that does not decode) or PrecompileError
    (the cache unreadable), naming the cache."""
    bundle = cache.envelope.bundle if cache.envelope is not None else None
    if bundle is None or not bundle.files:
        return {}
    data = read_bytes(Path(cache.path), "cache", PREFIX_SIZE + MAX_HEADER_SIZE + MAX_PAYLOAD_SIZE)
    return decode_payload(bundle, data, PREFIX_SIZE + (cache.header_size or 0), source=f"cache {cache.path}")
