"""The cache file's header: a msgspec Struct tagged by format version.

Evolution follows msgspec's rules: a new field gets a default; a change that old readers cannot
ignore gets a new tagged Struct beside the old one, and `CacheEnvelope` grows into a union of them.
Every version ever written keeps a fixture in `fixtures/` and stays readable.
"""

from typing import Literal

import msgspec

FORMAT_VERSION = 1

Backend = Literal["inductor", "eager"]
TracerTag = Literal["make_fx", "dynamo"]


class Producer(msgspec.Struct, frozen=True, kw_only=True):
    """Versions of what wrote the pair."""

    precompile: str
    torch: str
    python: str


class BundleFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of the kernel bundle, stored in the payload in index order."""

    path: str
    """Relative to the kernel cache directory, '/'-separated, never absolute or with '..'."""
    kind: str
    size: int
    sha256: str


class KernelBundle(msgspec.Struct, frozen=True, kw_only=True):
    """Index of the compiled kernels the payload carries, and what keys them to a host."""

    files: tuple[BundleFile, ...] = ()
    keys: dict[str, str] = {}
    """What the kernels depend on, which a serving host must match: the torch build, Python ABI,
    machine, CPU flags and ISA, and for GPU kernels the GPU architecture, CUDA and Triton build
    (see schema/bundle_keys.py). Bundles written before `provenance` also kept paths here."""
    payload_size: int = 0
    """Uncompressed size of the payload: the files' bytes concatenated in index order."""
    payload_compressed_size: int = 0
    payload_sha256: str = ""
    """sha256 of the compressed payload as stored."""
    kernels: dict[str, str] = {}
    """sha256 of a kernel's source in python_code -> the path of its compiled library in `files`."""
    provenance: dict[str, str] = {}
    """Where the producer's torch and Python lived and how it compiled (command hash): for
    information only, never compared with a serving host."""


class OpaqueCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What load's opaque-state rule (artifact/opaque_state.py) finds in python_code, found where its
    bytecode is compiled and kept beside it: load running the bytecode does not parse python_code, and
    applies these exactly as it applies the rule to a parse (`precompile verify` finds them again)."""

    problems: tuple[str, ...] = ()
    """Why the opaque parts are not as precompile writes them: load refuses the first."""
    labels: dict[str, str] | None = None
    """Each `_dynamo_bytecode` key's labelled sha256 (None: python_code has no marshalled code),
    which load gives the driver to check before marshal.loads."""


class CompiledCode(msgspec.Struct, frozen=True, kw_only=True):
    """python_code compiled at capture, kept as a hash-checked `.pyc` keeps it (PEP 552): load runs
    it instead of compiling the source only on an interpreter with the same magic number, for the
    python_code whose sha256 is the envelope's code_hash (see artifact/bytecode.py)."""

    code_hash: str
    """sha256 of the python_code compiled: used only while it is the envelope's code_hash too."""
    magic: str
    """importlib.util.MAGIC_NUMBER of the compiling interpreter, hex."""
    filename: str
    """The filename compiled in: fixed by the code_hash, so that compiling again gives the same bytes."""
    flags: int
    """compile() flags (no flag is inherited), and code_parts.PARTS for python_code stored a part at a time."""
    optimize: int
    marshal_version: int
    size: int
    """Bytes of the marshalled code (`data` decompressed)."""
    compressed_size: int
    sha256: str
    """sha256 of `data` as stored (compressed)."""
    data: bytes = b""
    """One zstd frame of marshal.dumps((code, modules), marshal_version): python_code's code (a tuple
    of its parts' code where stored a part at a time), and
    {sha256 of the text: code} of the Inductor output modules it carries as strings (see
    artifact/bytecode.py). `precompile verify` compiles python_code again and compares."""
    left_out: tuple[str, ...] = ()
    """The top-level metadata literals (`NAME = literal`) left out of the compiled code: only names
    no code in python_code reads (artifact/bytecode.LEFT_OUT). Caches written before compiled every
    statement; load runs only bytecode that leaves nothing out (a name python_code binds is bound
    under load too, so that no run-time read can tell the two apart)."""
    opaque: OpaqueCheck | None = None
    """What load's opaque-state rule finds in python_code (None where python_code names no opaque
    part; a cache written before it carries none, and load compiles such a python_code instead)."""
    part_lines: tuple[int, ...] = ()
    """Where python_code stored a part at a time (`flags` carries code_parts.PARTS) has each part
    start, from line 1: `data` then holds a tuple of module code objects, run in turn
    (artifact/code_parts.py). Empty for python_code compiled whole."""


class EncodedMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """python_code's metadata literals, converted once at capture and stored as typed msgpack:
    load decodes them instead of parsing python_code (see artifact/bytecode.py)."""

    code_hash: str
    """sha256 of the python_code whose literals these are: used only while it is the envelope's code_hash too."""
    size: int
    """Bytes of the msgpack (`data` decompressed)."""
    compressed_size: int
    sha256: str
    """sha256 of `data` as stored (compressed)."""
    data: bytes = b""
    """One zstd frame of msgspec.msgpack of the ArtifactMetadata; `precompile verify` compares it with
    the literals."""


class CacheEnvelopeV1(msgspec.Struct, frozen=True, kw_only=True, tag=1, tag_field="format_version"):
    """Format version 1 of the cache header."""

    code_hash: str
    """sha256 hex digest of the exact python_code bytes this cache belongs to."""
    backend: Backend
    tracer: TracerTag
    producer: Producer
    bundle: KernelBundle | None = None
    header_sha256: str = ""
    """sha256 of this header's other fields (see codec.header_digest), so that a change to any of
    them (a requirement, a file's kind or size, the kernel map) is caught. Headers written before it
    lack it: their bundle is not served (see schema/bundle_rules.py)."""
    python_bytecode: CompiledCode | None = None
    """python_code compiled (None: load compiles python_code, as caches written before it)."""
    metadata_msgpack: EncodedMetadata | None = None
    """python_code's metadata, typed (None: load parses python_code's literals)."""


# The union of every envelope version a reader understands; one member for now.
CacheEnvelope = CacheEnvelopeV1


def without_blob_data(envelope: CacheEnvelope) -> CacheEnvelope:
    """The envelope with its bytecode and metadata bytes left out (sizes and digests kept): what
    the inspect reports show."""
    code, meta = envelope.python_bytecode, envelope.metadata_msgpack
    if code is None and meta is None:
        return envelope
    return msgspec.structs.replace(
        envelope,
        python_bytecode=None if code is None else msgspec.structs.replace(code, data=b""),
        metadata_msgpack=None if meta is None else msgspec.structs.replace(meta, data=b""),
    )


class EnvelopeTag(msgspec.Struct):
    """Just the version tag: decoded first so a newer file gets a clear message, not a type error."""

    format_version: int
