"""The signature file beside python_code: its formats, where it lives, and the exact bytes a key signs.

Two formats share `<stem>.sig`: a DSSE envelope holding an in-toto statement (precompile.signing.
statement: the files and the release's identity), and the first format, `precompile-signature/1`
(the files only: it binds no identity), which is still read and written for pairs signed without
a name and release. Torch-free and crypto-free: reading a signature file, or telling that a pair has none, needs neither
torch nor the `sign` extra.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import msgspec

from precompile.artifact.pair import read_bytes
from precompile.errors import PrecompileError
from precompile.signing.dsse import DsseEnvelope

__all__ = ["FORMAT", "FileDigest", "Signature", "digest_file", "read_signature", "signature_path", "statement", "write_signature"]

FORMAT = "precompile-signature/1"
"""The format tag, written as the file's "format" field; a later incompatible format gets /2."""
MAX_SIGNATURE_SIZE = 64 * 1024
_CHUNK = 1024 * 1024


class FileDigest(msgspec.Struct, frozen=True, kw_only=True):
    """One file of the pair as signed: the sha256 of its exact bytes, and their number."""

    sha256: str
    size: int


class Signature(msgspec.Struct, frozen=True, kw_only=True, tag_field="format", tag=FORMAT):
    """`<stem>.sig` beside python_code `<stem>.py`: a detached signature over both files of the pair."""

    python_code: FileDigest
    cache: FileDigest
    key: str
    """The signing key's fingerprint: "SHA256:" and the sha256 of its DER SubjectPublicKeyInfo."""
    signature: str
    """Base64 of the DER ECDSA signature over `statement(python_code, cache)`."""


class _Head(msgspec.Struct):
    format: str = ""
    payloadType: str = ""


def signature_path(python_code: str | os.PathLike[str]) -> Path:
    """Where the signature of the pair whose python_code is `python_code` lives: same stem, suffix .sig."""
    return Path(python_code).with_suffix(".sig")


def statement(python_code: FileDigest, cache: FileDigest) -> bytes:
    """The bytes a key signs: the format tag, then each file's role, sha256 and size, one per line.
    Roles, not names: renaming a pair (and its .sig) keeps it signed; swapping its files does not."""
    return (
        f"{FORMAT}\n"
        f"python_code sha256 {python_code.sha256} size {python_code.size}\n"
        f"cache sha256 {cache.sha256} size {cache.size}\n"
    ).encode("ascii")


def digest_bytes(data: bytes | None) -> FileDigest | None:
    """The digest of bytes a reader holds; None for a file it could not read."""
    return None if data is None else FileDigest(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def digest_file(path: Path, what: str) -> FileDigest | None:
    """The digest of a regular file's bytes as they are now, read in chunks; None if it does not exist."""
    sha, size = hashlib.sha256(), 0
    try:
        if os.path.exists(path) and not os.path.isdir(path) and not stat.S_ISREG(os.stat(path).st_mode):
            raise PrecompileError(f"{what} {path} is not a regular file (a FIFO, device or socket); pass the file capture() wrote")
        # Opened without blocking and checked by its descriptor: a file swapped for a FIFO after the
        # check above is refused, not waited on (artifact/pair.read_bytes does the same).
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(path)
            if not stat.S_ISREG(mode):
                raise PrecompileError(f"{what} {path} is not a regular file (a FIFO, device or socket); pass the file capture() wrote")
            while chunk := handle.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise PrecompileError(f"{what} {path} is a directory, not a file; pass the file capture() wrote") from None
    except OSError as exc:
        raise PrecompileError(f"could not read {what} {path}: {exc.strerror or exc}") from None
    return FileDigest(sha256=sha.hexdigest(), size=size)


def read_signature(path: Path) -> Signature | DsseEnvelope | None:
    """The signature file at `path`; None if there is none. One that is unreadable, foreign, damaged or
    of a newer format is a PrecompileError naming the file and the remedy."""
    resign = "sign the pair again with `precompile sign` and the release key"
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise PrecompileError(f"signature {path} is not a regular file (a directory, FIFO, device or socket); "
                                  f"remove it, or {resign}")
        size = info.st_size
        if size > MAX_SIGNATURE_SIZE:
            raise PrecompileError(f"signature {path} is {size} bytes, over the {MAX_SIGNATURE_SIZE}-byte limit of a "
                                  f"precompile signature; it is not one: remove it, or {resign}")
        data = read_bytes(path, "signature", MAX_SIGNATURE_SIZE)  # a file swapped after the check is refused, not waited on
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PrecompileError(f"could not read signature {path}: {exc.strerror or exc}") from None
    try:
        head = msgspec.json.decode(data, type=_Head)
    except msgspec.DecodeError as exc:
        raise PrecompileError(f"signature {path} is not a precompile signature file ({exc}); remove it, or {resign}") from None
    if head.payloadType:
        try:
            return msgspec.json.decode(data, type=DsseEnvelope)
        except msgspec.DecodeError as exc:
            raise PrecompileError(f"signature {path} is a damaged DSSE envelope: {exc}; {resign}") from None
    found = head.format
    if found != FORMAT:
        if found.startswith("precompile-signature/"):
            raise PrecompileError(f"signature {path} has format {found!r}, this precompile reads {FORMAT!r}; upgrade precompile")
        raise PrecompileError(f"signature {path} has format {found!r}, expected {FORMAT!r}; it is not a precompile "
                              f"signature file: remove it, or {resign}")
    try:
        return msgspec.json.decode(data, type=Signature)
    except msgspec.DecodeError as exc:
        raise PrecompileError(f"signature {path} is damaged: {exc}; {resign}") from None


def write_signature(path: Path, signature: Signature | DsseEnvelope) -> None:
    """Write the signature file atomically: readers see the old file or the new one, never a part."""
    data = msgspec.json.format(msgspec.json.encode(signature), indent=2) + b"\n"
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise PrecompileError(f"could not write signature {path}: {exc.strerror or exc}") from None
