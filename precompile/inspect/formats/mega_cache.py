"""torch's Mega-Cache container, decoded statically: what `torch.compiler.save_cache_artifacts()`
returns, what upstream precompile stores as its cache's `artifact` field, and what projects publish.

Layout (torch/utils/_appending_byte_serializer.py and torch/compiler/_cache.py, `_ENCODING_VERSION`
1, unchanged from torch 2.6 through 2.14.1):

    crc32 of everything after it (4 bytes, big-endian)
    encoding version (u64, big-endian)
    then, per kind of cache:  kind (str) | entry count (u64) | count x (key (str) | content (bytes))

where bytes are a u64 big-endian length and the bytes, and a str is bytes holding the base64 of its
UTF-8. Each entry's content goes to one of torch's caches when loaded; content that is a pickle is
scanned with `scan_pickle` against the classes reviewed for its kind and the shape each may be
built in (`mega_cache_policy`), never unpickled, and read for the code it carries and the keys it
records (`mega_cache_code`) and for the fields torch evaluates or imports from it (`mega_cache_runs`). Every length is checked against what is left before anything is sliced.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import zlib

from precompile.artifact.pickle_machine import Budget, BuildState
from precompile.artifact.pickle_scan import is_pickle, scan_pickle
from precompile.inspect.formats.mega_cache_code import entry_code, recorded_keys
from precompile.inspect.formats.mega_cache_policy import call_shape_for, reviewed_for, with_stored_callables
from precompile.inspect.formats.mega_cache_runs import entry_runs
from precompile.inspect.model.artifact import Blob, MegaCache, MegaCacheContent, MegaCacheEntry

ENCODING_VERSION = 1
MAX_ENTRIES = 100_000
_U64 = 8
_CRC = 4


class _Truncated(ValueError):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, _CRC

    def finished(self) -> bool:
        return self.at == len(self.data)

    def u64(self, what: str) -> int:
        if self.at + _U64 > len(self.data):
            raise _Truncated(f"truncated at byte {self.at}: {what} needs 8 bytes, {len(self.data) - self.at} left")
        value = int.from_bytes(self.data[self.at : self.at + _U64], "big")
        self.at += _U64
        return value

    def raw(self, what: str) -> bytes:
        size = self.u64(f"the length of {what}")
        if size > len(self.data) - self.at:
            raise _Truncated(f"{what} at byte {self.at} declares {size} bytes, only {len(self.data) - self.at} left")
        value = self.data[self.at : self.at + size]
        self.at += size
        return value

    def text(self, what: str) -> str:
        raw = self.raw(what)
        try:
            return base64.b64decode(raw, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise _Truncated(f"{what} at byte {self.at - len(raw)} is not base64 of UTF-8: {exc}") from None


def crc_matches(data: bytes) -> bool:
    """True when `data` opens with the CRC32 of the rest: the cheap test that a blob is a Mega-Cache."""
    return len(data) >= _CRC + _U64 and data[:_CRC] == zlib.crc32(data[_CRC:]).to_bytes(_CRC, "big")


def looks_like_mega_cache(head: bytes) -> bool:
    """Content sniffing on a file's first bytes: a small version number, then a first record that is a
    cache kind's name. The checksum is not needed, so a damaged blob is recognised and reported as damaged."""
    if len(head) < _CRC + _U64 or int.from_bytes(head[_CRC : _CRC + _U64], "big") >= 1 << 16:
        return False
    reader = _Reader(head)
    reader.at += _U64
    try:
        kind = reader.text("a cache kind")
    except _Truncated:
        return False
    return 0 < len(kind) <= 64 and kind.replace("_", "").isalnum()


def _content_kind(content: bytes) -> MegaCacheContent:
    if is_pickle(content):  # protocol 0 and 1 pickles too, though they are valid UTF-8 text
        return "pickle"
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "text"


def _entries(reader: _Reader):
    """(kind, key, content) of each entry in order; raises _Truncated where the container is damaged."""
    count_so_far = 0
    while not reader.finished():
        kind = reader.text("a cache kind")
        count = reader.u64(f"the entry count of {kind}")
        count_so_far += count
        if count_so_far > MAX_ENTRIES:
            raise _Truncated(f"{kind} declares {count} entries, over the {MAX_ENTRIES}-entry limit")
        for _ in range(count):
            key = reader.text(f"a key of {kind}")
            yield kind, key, reader.raw(f"the content of {kind} {key}")


def read_mega_cache(data: bytes, *, where: str) -> MegaCache:
    """The container's entries; a damaged or newer container is described in `problem`, never raised."""
    blob = Blob(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    if len(data) < _CRC + _U64:
        return MegaCache(blob=blob, problem=f"{where}: {len(data)} bytes, too short for a Mega-Cache (checksum and version need 12)")
    stored, actual = data[:_CRC].hex(), zlib.crc32(data[_CRC:]).to_bytes(_CRC, "big").hex()
    if stored != actual:
        return MegaCache(blob=blob, crc32=stored, problem=(
            f"{where}: Mega-Cache checksum is {stored} but the content's crc32 is {actual}: the blob is damaged "
            "(torch.compiler.load_cache_artifacts would refuse it too)"))
    reader = _Reader(data)
    version = reader.u64("the encoding version")
    if version != ENCODING_VERSION:
        return MegaCache(blob=blob, crc32=stored, encoding_version=version, problem=(
            f"{where}: Mega-Cache encoding version {version}, this reader understands {ENCODING_VERSION}; "
            "inspect it with the torch that wrote it"))
    entries: list[MegaCacheEntry] = []
    pickles: list[bytes] = []
    problem = None
    limits = Budget()  # one for the whole blob: a blob of many entries does no more than one of its size
    try:
        for kind, key, content in _entries(reader):
            what = _content_kind(content)
            scan = None
            states: list[BuildState] = []
            if what == "pickle":
                pickles.append(content)
                scan = with_stored_callables(scan_pickle(content, member=f"{kind}/{key}", reviewed=reviewed_for(kind),
                                                         call_shape=call_shape_for(kind), states=states, limits=limits), kind)
            runs, modules = entry_runs(states, kind)
            entries.append(MegaCacheEntry(
                kind=kind,
                key=key,
                file=Blob(size=len(content), sha256=hashlib.sha256(content).hexdigest()),
                content=what,
                scan=scan,
                code=entry_code(content, modules) if what == "pickle" else (),
                runs=runs,
            ))
    except _Truncated as exc:
        problem = f"{where}: Mega-Cache {exc}"
    return MegaCache(blob=blob, crc32=stored, encoding_version=version, entries=tuple(entries), problem=problem,
                     recorded=recorded_keys(pickles))


def entry_contents(data: bytes) -> list[tuple[str, str, bytes]]:
    """(kind, key, content) of each well-formed entry, for extract; stops where damage starts."""
    if not crc_matches(data):
        return []
    reader = _Reader(data)
    out: list[tuple[str, str, bytes]] = []
    try:
        if reader.u64("the encoding version") == ENCODING_VERSION:
            for entry in _entries(reader):
                out.append(entry)
    except _Truncated:
        pass
    return out
