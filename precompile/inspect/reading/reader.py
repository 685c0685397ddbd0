"""Open an artifact pair into the typed model without executing, importing or unpickling it.

Reuses the schema's readers (`precompile.artifact.pair`, `pycode`, `codec`); adds what forensics
needs on top: a model that keeps going past a bad file, version tags read even when too new, and
recognition of the formats of `formats/` (upstream precompile pairs, Mega-Caches, torch.save zips,
bare pickles), every pickle scanned statically.
By default the cache is read header-first (the payload is only measured); `deep=True` also reads
and hashes the payload, for verify and extract.
"""
from __future__ import annotations

import ast
import collections
import functools
import hashlib
import os
import stat
import zipfile
from pathlib import Path

import msgspec

from precompile.artifact.codec import MAGIC, MAX_HEADER_SIZE, MAX_PAYLOAD_SIZE, PREFIX_SIZE
from precompile.artifact.envelope import FORMAT_VERSION, EnvelopeTag, without_blob_data
from precompile.artifact.pair import PythonCode, pairing_problem, parse_cache, read_bytes
from precompile.artifact.pickle_ops import OPCODE_BYTES
from precompile.artifact.pickle_scan import MAX_PICKLE_SIZE, is_pickle, scan_pickle
from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE, decode_source, metadata_of
from precompile.errors import PrecompileError
from precompile.inspect.formats.mega_cache import looks_like_mega_cache, read_mega_cache
from precompile.inspect.formats.upstream import (
    CACHE_VERSION,
    envelope_problem,
    upstream_code,
    upstream_envelope,
    upstream_pairing_problem,
)
from precompile.inspect.model.artifact import (
    Artifact,
    Blob,
    CacheInfo,
    PythonCodeInfo,
    UpstreamCache,
    ZipMember,
)
from precompile.inspect.parsing import part_readings, rendered_guards
from precompile.inspect.parsing.chunked_parse import read_parts
from precompile.inspect.parsing.opaque import OpaqueReader
from precompile.inspect.parsing.sections import split_sections

MAX_ZIP_MEMBERS = 10_000
SNIFF_SIZE = 256
"""Bytes read to tell a file's kind by its content."""


def resolve_pair(paths: list[str]) -> tuple[str, str]:
    """(python_code path, cache path) from two paths, a directory holding one pair, or a prefix."""
    if len(paths) == 2:
        return paths[0], paths[1]
    if len(paths) != 1:
        raise PrecompileError(f"expected an artifact as PYTHON_CODE CACHE, a directory or a path prefix; got {len(paths)} paths")
    given = paths[0]
    if os.path.isdir(given):
        try:
            names = set(os.listdir(given))
        except OSError as exc:
            raise PrecompileError(f"could not list directory {given}: {exc.strerror or exc}") from None
        stems = sorted(name[:-3] for name in names if name.endswith(".py") and f"{name[:-3]}.cache" in names)
        if len(stems) != 1:
            found = ", ".join(stems) if stems else "none"
            raise PrecompileError(
                f"directory {given} must hold exactly one pair NAME.py + NAME.cache (found: {found}); "
                "pass the two files or the prefix DIR/NAME instead"
            )
        return os.path.join(given, f"{stems[0]}.py"), os.path.join(given, f"{stems[0]}.cache")
    for suffix in (".py", ".cache"):
        if given.endswith(suffix) and os.path.isfile(given):
            stem = given[: -len(suffix)]
            return f"{stem}.py", f"{stem}.cache"
    if os.path.isfile(f"{given}.py"):
        return f"{given}.py", f"{given}.cache"
    raise PrecompileError(
        f"{given} is neither a directory with one pair, a python_code file, nor a prefix of {given}.py; "
        "pass PYTHON_CODE CACHE"
    )


def _blob(data: bytes) -> Blob:
    return Blob(size=len(data), sha256=hashlib.sha256(data).hexdigest())


def read_python_code(path: str) -> tuple[PythonCodeInfo, PythonCode | None]:
    """The model of a python_code file; a file that cannot be read at all raises PrecompileError."""
    data = read_bytes(Path(path), "python_code", MAX_PYTHON_CODE_SIZE)
    info, metadata, _ = _parse_python_code(data, path)
    if metadata is None:
        return info, None
    return info, PythonCode.parsed(Path(path), data, data.decode("utf-8"), metadata)


def rendered_guards_found(data: bytes, path: str) -> rendered_guards.Rendered | None:
    """Where python_code renders its guards (the top-level statements `rendered_guards` reads), as the
    one parse of `read_python_code` found them; None when python_code does not parse."""
    return _parse_python_code(data, path)[2]


@functools.lru_cache(maxsize=4)
def _parse_python_code(data: bytes, path: str):
    """Parsed once per content and path, a part at a time (`chunked_parse`: each part's syntax tree
    serves the pickle scan, the metadata and where the rendered guards are), the parts this file
    shares with the file read before it not parsed again (`part_readings`): `diff A B` parses B's
    differences only, and repeated verbs in one process reuse the whole result."""
    blob = _blob(data)
    try:
        source = decode_source(data, filename=path)
    except PrecompileError as exc:
        return PythonCodeInfo(path=path, file=blob, problem=str(exc)), None, None
    sections = tuple(section for section, _ in split_sections(source))
    opaque = OpaqueReader(source, sections)
    values: dict = {}
    guard_spans: list[tuple[int, int]] = []
    kept: list[tuple[ast.stmt, int]] | None = []  # the rendered guards' trees, while within KEPT_LINES
    kept_lines = 0
    parts: dict[str, part_readings.PartReading | None] = {}  # every part met, by sha256 (None: not parsed alone)
    try:
        for part, first_line in read_parts(source, filename=path, read=part_readings.read,
                                           known=collections.ChainMap(parts, part_readings.last_file())):
            before = first_line - 1
            opaque.add(part.opaque, first_line)
            values.update(part.values_at(before))
            guard_spans.extend((first + before, last + before) for first, last in part.guard_spans)
            kept_lines += sum(last - first + 1 for first, last in part.guard_spans)
            if kept is not None and part.guards is not None and kept_lines <= rendered_guards.KEPT_LINES:
                kept.extend((statement, before) for statement in part.guards)
            else:
                kept = None
    except PrecompileError as exc:
        return PythonCodeInfo(path=path, file=blob, sections=sections, problem=str(exc)), None, None
    part_readings.remember(parts, trees=kept is not None)
    spans = rendered_guards.Rendered(tuple(guard_spans), tuple(kept) if kept is not None else None)
    pickles, opaque_problems = opaque.finish(values)
    version = values.get("FORMAT_VERSION")
    version = version if isinstance(version, int) and not isinstance(version, bool) else None
    tracer = values.get("TRACER")
    info = PythonCodeInfo(
        path=path,
        file=blob,
        format_version=version,
        tracer=tracer if isinstance(tracer, str) else None,
        literal_names=tuple(sorted(values)),
        sections=sections,
        pickles=pickles,
        opaque_problems=opaque_problems,
    )
    upstream = upstream_code(values)
    if upstream is not None:
        return msgspec.structs.replace(info, upstream=upstream), None, spans
    try:
        metadata = metadata_of(values, filename=path)
    except PrecompileError as exc:
        newer = version is not None and version > FORMAT_VERSION
        return msgspec.structs.replace(info, problem=str(exc), newer=newer), None, spans
    return msgspec.structs.replace(info, metadata=metadata), metadata, spans


def _read_prefix(path: str, size: int) -> bytes:
    """The first `size` bytes of a file already found regular (opening never blocks, should it have
    been swapped for a FIFO since)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(size)


def read_cache(path: str, *, deep: bool = False) -> CacheInfo:
    """The model of a cache file; every problem is reported in it, never raised."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(info.st_mode):
            return CacheInfo(path=path, kind="missing",
                             problem=f"cache {path} is not a regular file (a FIFO, device or socket); pass the file capture() wrote")
        size = info.st_size
        head = _read_prefix(path, PREFIX_SIZE)
    except FileNotFoundError:
        return CacheInfo(path=path, kind="missing", problem=f"cache {path} does not exist")
    except IsADirectoryError:
        return CacheInfo(path=path, kind="missing", problem=f"cache {path} is a directory, not a file")
    except OSError as exc:
        return CacheInfo(path=path, kind="missing", problem=f"could not read cache {path}: {exc.strerror or exc}")
    if head.startswith(MAGIC) and len(head) == PREFIX_SIZE:
        return _read_envelope(path, size, head, deep)
    if head.startswith(b"PK"):
        return _read_zip(path, size)
    if _has_pickle_header(head):
        return _read_bare_pickle(path, size)
    if looks_like_mega_cache(_read_prefix(path, SNIFF_SIZE)):
        if size > MAX_PICKLE_SIZE:
            return CacheInfo(path=path, kind="mega_cache", problem=f"cache {path} is a {size}-byte Mega-Cache, over the {MAX_PICKLE_SIZE}-byte limit")
        return _read_bare_mega_cache(path, read_bytes(Path(path), "cache", MAX_PICKLE_SIZE))
    if _is_text_pickle(path, size, head):
        return _read_bare_pickle(path, size)
    data = head if not deep else _read_bounded(path, size)
    cache = parse_cache(Path(path), data)
    return CacheInfo(path=path, kind="unknown", file=_blob(data) if deep else None, problem=cache.problem or "unrecognized cache")


def _read_bounded(path: str, size: int) -> bytes:
    limit = PREFIX_SIZE + MAX_HEADER_SIZE + MAX_PAYLOAD_SIZE
    if size > limit:
        raise PrecompileError(f"cache {path} is {size} bytes, over the {limit}-byte limit")
    return read_bytes(Path(path), "cache", limit)


def _read_envelope(path: str, size: int, head: bytes, deep: bool) -> CacheInfo:
    header_size = int.from_bytes(head[len(MAGIC) : PREFIX_SIZE], "little")
    try:
        if deep:
            data = _read_bounded(path, size)
        elif header_size <= MAX_HEADER_SIZE:
            data = _read_prefix(path, PREFIX_SIZE + header_size)
        else:
            data = head  # decode_header refuses the size before anything is allocated
    except PrecompileError as exc:
        return CacheInfo(path=path, kind="precompile", problem=str(exc))
    cache = parse_cache(Path(path), data)
    file = _blob(data) if deep else None
    if cache.envelope is None:
        version = _version_tag(data, header_size)
        return CacheInfo(
            path=path,
            kind="precompile",
            file=file,
            format_version=version,
            header_size=header_size,
            problem=cache.problem,
            newer=version is not None and version > FORMAT_VERSION,
        )
    offset = cache.payload_offset
    payload = _blob(data[offset:]) if deep else Blob(size=size - offset, sha256="")
    tag = cache.envelope.__struct_config__.tag
    assert isinstance(tag, int)  # each envelope layout is tagged with its int format_version
    return CacheInfo(
        path=path,
        kind="precompile",
        file=file,
        envelope=without_blob_data(cache.envelope),  # sizes and digests; verify reads the bytes itself
        format_version=tag,
        header_size=header_size,
        payload=payload,
    )


def _version_tag(data: bytes, header_size: int) -> int | None:
    if header_size > MAX_HEADER_SIZE or len(data) < PREFIX_SIZE + header_size:
        return None
    try:
        return msgspec.msgpack.decode(data[PREFIX_SIZE : PREFIX_SIZE + header_size], type=EnvelopeTag).format_version
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int = MAX_PICKLE_SIZE) -> bytes:
    """A zip member's raw bytes, never more than `limit` (whatever its header declares)."""
    with archive.open(info) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"member {info.filename} is over the {limit}-byte limit")
    return data


def _read_zip(path: str, size: int) -> CacheInfo:
    upstream_note = (
        f"cache {path} is a torch.save zip (upstream torch.compiler.precompile format), not a precompile cache"
    )
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_ZIP_MEMBERS:
                raise ValueError(f"{len(infos)} members, over the {MAX_ZIP_MEMBERS}-member limit")
            members = tuple(ZipMember(name=i.filename, size=i.file_size, compressed_size=i.compress_size) for i in infos)
            pickles = []
            envelope = None
            for info in sorted(infos, key=lambda i: i.filename):
                if info.filename.endswith(".pkl"):
                    if info.file_size > MAX_PICKLE_SIZE:
                        raise ValueError(f"member {info.filename} declares {info.file_size} bytes, over the {MAX_PICKLE_SIZE}-byte scan limit")
                    data = read_member(archive, info)
                    pickles.append(scan_pickle(data, member=info.filename))
                    if info.filename.endswith("data.pkl") and envelope is None:
                        envelope = upstream_envelope(data, where=f"cache {path}")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
        # zlib.error is an Exception subclass too; everything a broken zip can raise is reported
        return CacheInfo(path=path, kind="torch_save_zip", problem=f"{upstream_note}, and it cannot be read: {exc}")
    except Exception as exc:  # a corrupt member stream (zlib.error, ...) is a finding, not a crash
        return CacheInfo(path=path, kind="torch_save_zip", problem=f"{upstream_note}, and it cannot be read: {type(exc).__name__}: {exc}")
    if envelope is not None:
        return CacheInfo(
            path=path,
            kind="upstream_precompile",
            file=Blob(size=size, sha256=""),
            format_version=envelope.version,
            upstream=UpstreamCache(container="torch_save_zip", members=members, pickles=tuple(pickles), precompile=envelope),
            problem=envelope_problem(envelope, path),
            newer=envelope.version is not None and envelope.version > CACHE_VERSION,
        )
    if not any(m.name.endswith("data.pkl") for m in members):
        upstream_note = f"cache {path} is a zip file without a data.pkl: neither a precompile cache nor a torch.save archive"
    return CacheInfo(
        path=path,
        kind="torch_save_zip",
        file=Blob(size=size, sha256=""),
        upstream=UpstreamCache(container="torch_save_zip", members=members, pickles=tuple(pickles)),
        problem=upstream_note,
    )


def _read_bare_mega_cache(path: str, data: bytes) -> CacheInfo:
    mega = read_mega_cache(data, where=f"cache {path}")
    return CacheInfo(
        path=path,
        kind="mega_cache",
        file=_blob(data),
        format_version=mega.encoding_version,
        upstream=UpstreamCache(container="mega_cache", mega_cache=mega),
        problem=mega.problem,
    )


def _read_bare_pickle(path: str, size: int) -> CacheInfo:
    if size > MAX_PICKLE_SIZE:
        return CacheInfo(path=path, kind="pickle", problem=f"cache {path} is a {size}-byte pickle, over the {MAX_PICKLE_SIZE}-byte scan limit")
    data = read_bytes(Path(path), "cache", MAX_PICKLE_SIZE)
    scan = scan_pickle(data, member="(file)")
    return CacheInfo(
        path=path,
        kind="pickle",
        file=_blob(data),
        upstream=UpstreamCache(container="pickle", pickles=(scan,)),
        problem=f"cache {path} is a bare pickle, not a precompile cache",
    )


def open_artifact(python_code_path: str, cache_path: str, *, deep: bool = False, prove: bool = False,
                  proof_memory_mib: int | None = None) -> Artifact:
    """The typed model of a pair; raises PrecompileError only when python_code cannot be read at all.
    `prove`: start the bytecode proof verify and diff make (with `proof_memory_mib`) first, so that
    it runs while python_code is parsed."""
    if prove:
        from precompile.inspect.verify.verify import start_proofs

        start_proofs([(python_code_path, cache_path)], proof_memory_mib)
    code_info, code = read_python_code(python_code_path)
    cache = read_cache(cache_path, deep=deep)
    envelope = cache.upstream.precompile if cache.upstream is not None else None
    if code_info.upstream is not None and envelope is not None:
        assert code_info.file is not None  # upstream python_code was recognised in the file's bytes
        problem = upstream_pairing_problem(code_info.file.sha256, code_info.upstream, envelope)
        return Artifact(python_code=code_info, cache=cache, pairs=problem is None, pairing_problem=problem)
    if code is None or cache.envelope is None:
        return Artifact(python_code=code_info, cache=cache, pairs=None)
    problem = pairing_problem(code, cache.envelope)
    return Artifact(python_code=code_info, cache=cache, pairs=problem is None, pairing_problem=problem)


def python_code_bytes(artifact: Artifact) -> bytes | None:
    """The bytes of an opened artifact's python_code (what its guards and code are read from), or None
    when it was opened without one or it cannot be read now."""
    if not artifact.python_code.path:
        return None
    try:
        return read_bytes(Path(artifact.python_code.path), "python_code", MAX_PYTHON_CODE_SIZE)
    except PrecompileError:
        return None


def _has_pickle_header(head: bytes) -> bool:
    """A protocol 2-5 pickle, told by its first two bytes."""
    return len(head) >= 2 and head[0] == 0x80 and is_pickle(head[:2])


def _is_text_pickle(path: str, size: int, head: bytes) -> bool:
    """A protocol 0/1 pickle (no header: it may even read as text or Python), told by reading the whole
    file as an opcode stream (`is_pickle`); files past the scan limit are not read."""
    if not head or head[0] not in OPCODE_BYTES or size > MAX_PICKLE_SIZE:
        return False
    return is_pickle(read_bytes(Path(path), "file", MAX_PICKLE_SIZE))


def _is_cache_content(head: bytes, path: str) -> bool:
    """Whether a file's content says it is a cache of a kind this reader knows (a pickle of any
    protocol included), not python_code."""
    if head.startswith(MAGIC) or head.startswith(b"PK") or _has_pickle_header(head):
        return True
    return looks_like_mega_cache(_read_prefix(path, SNIFF_SIZE)) or _is_text_pickle(path, os.stat(path).st_size, head)


def is_mega_cache_file(path: str) -> bool:
    """Whether `path` is a regular file whose content is a bare Mega-Cache blob (told as read_cache tells it)."""
    try:
        return os.path.isfile(path) and looks_like_mega_cache(_read_prefix(path, SNIFF_SIZE))
    except OSError:
        return False


def open_one(path: str, *, deep: bool = False) -> Artifact:
    """One file alone, of any kind this reader knows, told apart by its content (not its name): a
    precompile or upstream cache, a bare Mega-Cache blob, a bare pickle, or python_code (ours or upstream's)."""
    try:
        head = _read_prefix(path, PREFIX_SIZE)
    except OSError as exc:
        raise PrecompileError(f"could not read {path}: {exc.strerror or exc}") from None
    if _is_cache_content(head, path):
        cache = read_cache(path, deep=deep)
        if cache.kind == "pickle" and cache.upstream is not None:
            cache = msgspec.structs.replace(cache, problem=None)  # alone, a bare pickle is what was asked about
        return Artifact(python_code=PythonCodeInfo(path=""), cache=cache, pairs=None, given="cache")
    code_info, _ = read_python_code(path)
    return Artifact(python_code=code_info, cache=CacheInfo(path="", kind="absent"), pairs=None, given="python_code")


def given_pair(paths: list[str]) -> tuple[str, str] | None:
    """The pair the user named (two paths, a directory, a prefix, or one file of a pair whose sibling
    NAME.py/NAME.cache exists), or None for one file alone."""
    if len(paths) == 1 and os.path.isfile(paths[0]):
        stem, suffix = os.path.splitext(paths[0])
        sibling = {".py": f"{stem}.cache", ".cache": f"{stem}.py"}.get(suffix)
        if sibling is None or not os.path.isfile(sibling):
            return None
    return resolve_pair(paths)


def open_given(paths: list[str], *, deep: bool = False, prove: bool = False) -> Artifact:
    """What the user named: a pair (`given_pair`), or else one file alone."""
    pair = given_pair(paths)
    if pair is None:
        return open_one(paths[0], deep=deep)
    return open_artifact(*pair, deep=deep, prove=prove)
