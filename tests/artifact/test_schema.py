"""The torch-free format definition: import hygiene, JSON Schema drift, the cache codec."""
from __future__ import annotations

import contextlib
import gc
import hashlib

import msgspec
import pytest

from conftest import run_fresh
from precompile.errors import PrecompileError
from precompile.artifact import codec
from precompile.artifact import jsonschema
from precompile.artifact.envelope import CacheEnvelopeV1, Producer
from precompile.artifact.pycode import parse_metadata, parse_source

PRODUCER = Producer(precompile="0.1.0", torch="2.13.0+cpu", python="3.11.7")


def envelope(**changes) -> CacheEnvelopeV1:
    fields = dict(code_hash="ab" * 32, backend="eager", tracer="make_fx", producer=PRODUCER)
    return CacheEnvelopeV1(**{**fields, **changes})


def test_schema_and_inspect_do_not_import_torch():
    proc = run_fresh(
        "import sys, precompile, precompile.artifact.pair, precompile.artifact.jsonschema, precompile.inspect;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(jsonschema.EXPORTED))
def test_committed_json_schema_matches_the_structs(name):
    assert jsonschema.committed(name) == jsonschema.render(jsonschema.EXPORTED[name]), (
        f"{name} drifted from the Structs: run `python -m precompile.artifact.jsonschema` and commit the result"
    )


def test_envelope_round_trips_header_first_without_a_bundle():
    data = codec.encode_cache(envelope())
    decoded, offset = codec.decode_header(data)
    assert decoded == msgspec.structs.replace(envelope(), header_sha256=decoded.header_sha256)
    assert decoded.header_sha256 == codec.header_digest(data[codec.PREFIX_SIZE :])
    assert offset == len(data)
    assert msgspec.msgpack.decode(data[codec.PREFIX_SIZE :])["format_version"] == 1


def test_bundle_round_trips_and_header_decodes_without_touching_payload():
    files = {"ab/k.main.so": ("kernel", b"\x7fELF" + b"x" * 1000), "ab/k.main.cpp": ("kernel-source", b"int main(){}")}
    bundle, payload = codec.build_bundle(files, {"torch": "2.13.0+cpu", "isa": "avx512"})
    data = codec.encode_cache(envelope(bundle=bundle), payload)
    decoded, offset = codec.decode_header(data[: len(data) - len(payload)] + b"\0" * len(payload))
    assert decoded.bundle == bundle  # header-first: a garbage payload does not matter here
    assert [f.path for f in bundle.files] == ["ab/k.main.cpp", "ab/k.main.so"]
    assert codec.decode_payload(bundle, data, offset) == {path: content for path, (_, content) in files.items()}


def test_bundle_that_lies_about_its_sizes_is_refused_before_decompressing():
    bundle, payload = codec.build_bundle({"ab/a.main.so": ("kernel", b"y" * 4096)}, {})
    liar = msgspec.structs.replace(bundle, payload_size=10**12, files=(msgspec.structs.replace(bundle.files[0], size=10**12),))
    data = codec.encode_cache(envelope(bundle=liar), payload)
    decoded, offset = codec.decode_header(data)
    with pytest.raises(codec.CacheFormatError, match="over the .*-byte limit"):
        codec.decode_payload(decoded.bundle, data, offset)


def test_bundle_file_whose_sha256_differs_is_never_used():
    bundle, payload = codec.build_bundle({"ab/a.main.so": ("kernel", b"y" * 64)}, {})
    forged = msgspec.structs.replace(bundle, files=(msgspec.structs.replace(bundle.files[0], sha256=hashlib.sha256(b"z").hexdigest()),))
    data = codec.encode_cache(envelope(bundle=forged), payload)
    decoded, offset = codec.decode_header(data)
    with pytest.raises(codec.CacheFormatError, match="a.main.so does not match its sha256"):
        codec.decode_payload(decoded.bundle, data, offset)


def _respelled(data: bytes, old: bytes, new: bytes) -> bytes:
    """Cache bytes whose header has `old` replaced by `new` (its length prefix updated)."""
    header = data[codec.PREFIX_SIZE:]
    assert header.count(old) == 1
    header = header.replace(old, new)
    return codec.MAGIC + len(header).to_bytes(4, "little") + header


def test_a_header_digest_holds_whatever_encoder_spelled_the_header():
    """A header as this precompile writes it is checked on its bytes as they are; one that another
    encoder spelled otherwise (a 64-character str as str16 rather than str8) is checked on its fields
    re-encoded, as header_digest defines the digest; a changed byte fails either way."""
    data = codec.encode_cache(envelope(code_hash="cd" * 32))
    str8, str16 = b"\xd9\x40" + b"cd" * 32, b"\xda\x00\x40" + b"cd" * 32
    assert codec.decode_header(data)[0].code_hash == "cd" * 32
    respelled = _respelled(data, str8, str16)
    assert codec.decode_header(respelled)[0] == codec.decode_header(data)[0]
    for changed in (_respelled(data, str8, str8.replace(b"cd", b"ce", 1)), _respelled(respelled, str16, str16.replace(b"cd", b"ce", 1))):
        with pytest.raises(codec.CacheFormatError, match="does not match its header_sha256"):
            codec.decode_header(changed)
    # a key written twice, sealed over the header's own bytes: what it decodes to (the last value) is
    # not what the digest covers (header_digest re-encodes the fields the map holds once each)
    fields = msgspec.msgpack.decode(data[codec.PREFIX_SIZE:])
    fields.pop("header_sha256")
    body = b"".join(msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v) for k, v in fields.items())
    body += msgspec.msgpack.encode("code_hash") + msgspec.msgpack.encode("ef" * 32)
    digest = hashlib.sha256(bytes([0x80 + len(fields) + 1]) + body).hexdigest()
    header = bytes([0x80 + len(fields) + 2]) + body + msgspec.msgpack.encode("header_sha256") + msgspec.msgpack.encode(digest)
    with pytest.raises(codec.CacheFormatError, match="does not match its header_sha256"):
        codec.decode_header(codec.MAGIC + len(header).to_bytes(4, "little") + header)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:5], "not a precompile cache file"),
        (lambda d: b"PK\x03\x04" + d[4:], "not a precompile cache file"),
        (lambda d: d[: codec.PREFIX_SIZE + 3], "is truncated"),
        (lambda d: d[: len(codec.MAGIC)] + (2**31).to_bytes(4, "little") + d[codec.PREFIX_SIZE :], "over the .*-byte limit"),
    ],
)
def test_unreadable_caches_raise_cache_format_error(mutate, message):
    with pytest.raises(codec.CacheFormatError, match=message):
        codec.decode_header(mutate(codec.encode_cache(envelope())))


def test_newer_format_version_is_named_as_newer():
    header = msgspec.msgpack.encode({"format_version": 7, "code_hash": "x", "future": True})
    data = codec.MAGIC + len(header).to_bytes(4, "little") + header
    with pytest.raises(codec.CacheFormatError, match="format version 7, newer than this precompile understands"):
        codec.decode_header(data)


def test_python_code_metadata_errors_name_the_file():
    with pytest.raises(PrecompileError, match="m.py is not a precompile artifact"):
        parse_metadata("x = 1\n", filename="m.py")
    with pytest.raises(PrecompileError, match=r"m.py is not valid Python \(line 1"):
        parse_metadata("def (:\n", filename="m.py")
    with pytest.raises(PrecompileError, match=r"m.py has format version 99, newer"):
        parse_metadata("FORMAT_VERSION = 99\nTRACER = 'make_fx'\n", filename="m.py")
    with pytest.raises(PrecompileError, match=r"not a Python literal: BACKEND \(line 3\)"):
        parse_metadata("FORMAT_VERSION = 1\nTRACER = 'make_fx'\nBACKEND = open('x')\n", filename="m.py")
    with pytest.raises(PrecompileError, match=r"m.py has malformed metadata: Object missing required field"):
        parse_metadata("FORMAT_VERSION = 1\nTRACER = 'make_fx'\nBACKEND = 'eager'\n", filename="m.py")


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("source", ["FORMAT_VERSION = 1\n", "def (:\n"])
def test_parsing_leaves_the_cyclic_collector_as_it_found_it(enabled, source):
    """parse_source pauses the collector while it builds the tree: on again after, off if it was off,
    also when the source is not Python."""
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with contextlib.suppress(PrecompileError):
            parse_source(source, filename="m.py")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_upper_case_names_the_metadata_does_not_read_may_be_any_expression():
    source = "FORMAT_VERSION = 1\nTRACER = 'make_fx'\nHELPER_TABLE = globals().get('x')\n"
    with pytest.raises(PrecompileError, match="malformed metadata: Object missing required field"):
        parse_metadata(source, filename="m.py")  # not the HELPER_TABLE line
