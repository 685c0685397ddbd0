"""What both tracers' builds share once their python_code is rendered: the cache that pairs with it,
and the name a captured fn goes by."""
from __future__ import annotations

import sys

import torch

from precompile._version import __version__
from precompile.artifact import bytecode
from precompile.artifact.codec import encode_cache
from precompile.artifact.envelope import CacheEnvelopeV1, Producer
from precompile.artifact.pycode import code_hash, decode_source, parse_metadata, parse_source


def cache_for(python_code: bytes, *, backend: str, tracer: str, bundle, payload: bytes) -> bytes:
    """The cache file that pairs with `python_code`: its envelope, tagged and hashed, the bundle, and
    what load would otherwise do itself: python_code compiled, and its metadata literals decoded
    (from the rendered text, exactly as load and verify read them)."""
    digest = code_hash(python_code)
    source = decode_source(python_code)
    tree = parse_source(source)
    compiled, metadata = bytecode.prepare(source, digest, parse_metadata(tree), tree)
    envelope = CacheEnvelopeV1(
        code_hash=digest,
        backend=backend,
        tracer=tracer,
        producer=Producer(
            precompile=__version__, torch=str(torch.__version__), python=".".join(map(str, sys.version_info[:3]))
        ),
        bundle=bundle,
        python_bytecode=compiled,
        metadata_msgpack=metadata,
    )
    return encode_cache(envelope, payload)


def qualified_name(fn) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
