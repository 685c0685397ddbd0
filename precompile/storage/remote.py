"""Reading objects at fsspec URLs, bounded as local reads are (artifact/pair.py's read_bytes): the
size the store declares is checked before anything is allocated, and no more than the limit is read
whatever it declared. Credentials and endpoints come from each backend's own environment (AWS_*,
including AWS_ENDPOINT_URL, for s3://; GOOGLE_APPLICATION_CREDENTIALS for gs://; HF_TOKEN for hf://).
fsspec and the backends are the optional extra precompile[remote]."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precompile.errors import PrecompileError
from precompile.storage.locations import EXTRA

VALIDATORS = ("ETag", "etag", "Content-MD5", "Digest", "VersionId", "generation", "md5Hash", "crc32c", "checksum",
              "blob_id", "lfs")
"""The fields of an fsspec `info()` that change whenever the object's bytes do (ETags, store checksums,
object versions): the fetch cache reuses a copy only where one of them is recorded and unchanged."""


@dataclass(frozen=True)
class RemoteObject:
    url: str
    size: int | None
    """The size the store declares (None where it declares none, e.g. an HTTP server without Content-Length)."""
    stamp: tuple[tuple[str, str], ...]
    """The validators `info()` gave (see VALIDATORS), and the size: equal stamps mean the same bytes."""


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem serving `url` and the path within it; a PrecompileError naming the extra
    to install where fsspec or the URL's backend is missing."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise PrecompileError(f"{url} is a URL, and reading URLs needs fsspec: {EXTRA}") from None
    try:
        return url_to_fs(url)
    except ImportError as exc:
        raise PrecompileError(f"{url}: the backend for this URL is not installed ({exc}); {EXTRA} installs s3://, "
                              "and fsspec names the package for the others") from None
    except (ValueError, TypeError) as exc:
        raise PrecompileError(f"{url} is not a URL fsspec can open: {exc}") from None


class Missing(PrecompileError):
    """The store says the object does not exist."""


class Unreachable(PrecompileError):
    """The store could not be asked (no connection, a timeout, a server error): it said nothing of the object."""


def _said_nothing(exc: FileNotFoundError) -> bool:
    """Whether a backend's FileNotFoundError stands for a store that could not be asked: fsspec's HTTP
    backend raises one for a refused connection, a timeout or a server error alike, from the cause."""
    cause = exc.__cause__
    status = getattr(cause, "status", None)
    return (isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError)) or (
        isinstance(status, int) and status >= 500)


def _failure(url: str, what: str, exc: BaseException) -> PrecompileError:
    if isinstance(exc, FileNotFoundError) and _said_nothing(exc):
        return Unreachable(f"could not read {what} {url}: {type(exc.__cause__).__name__}: {exc.__cause__}")
    if isinstance(exc, FileNotFoundError):
        return Missing(f"{what} {url} does not exist; pass the URL of the file capture() wrote")
    if isinstance(exc, PermissionError):
        return PrecompileError(f"could not read {what} {url}: permission denied; check the backend's credentials in the environment")
    return Unreachable(f"could not read {what} {url}: {type(exc).__name__}: {exc}")


def stat(url: str, what: str) -> RemoteObject:
    """What the store says of the object at `url`: Missing if it is missing, Unreachable where the store
    could not be asked, a PrecompileError if it is a directory."""
    fs, path = filesystem(url)
    try:
        fs.invalidate_cache(path)  # the store's word now, not a listing this process cached before
        info = fs.info(path)
    except Exception as exc:  # every backend raises its own kinds: each becomes a PrecompileError naming the URL
        raise _failure(url, what, exc) from None
    if info.get("type") == "directory":
        raise PrecompileError(f"{what} {url} is a directory, not a file; pass the file capture() wrote")
    size = info.get("size")
    size = size if isinstance(size, int) and not isinstance(size, bool) else None
    stamp = tuple(sorted((key, str(info[key])) for key in VALIDATORS if info.get(key) is not None))
    return RemoteObject(url=url, size=size, stamp=stamp + ((("size", str(size)),) if stamp else ()))


def read(found: RemoteObject, what: str, limit: int) -> bytes:
    """The object's bytes, at most `limit` of them: its declared size is checked first."""
    if found.size is not None and found.size > limit:
        raise PrecompileError(f"{what} {found.url} is {found.size} bytes, over the {limit}-byte limit for a precompile artifact")
    fs, path = filesystem(found.url)
    try:
        with fs.open(path, "rb") as handle:
            data = handle.read(limit + 1 if found.size is None else found.size + 1)
    except Exception as exc:  # see stat()
        raise _failure(found.url, what, exc) from None
    if len(data) > limit:
        raise PrecompileError(f"{what} {found.url} is over the {limit}-byte limit for a precompile artifact")
    if found.size is not None and len(data) != found.size:
        raise PrecompileError(f"{what} {found.url} changed while it was read ({found.size} bytes declared, {len(data)} read); "
                              "read it again once its writer is done")
    return data


def exists(url: str) -> bool:
    """Whether `url` names a file; a PrecompileError where the store cannot be asked (credentials,
    network), so that the reason is named rather than taken for absence."""
    fs, path = filesystem(url)
    try:
        return fs.info(path).get("type") != "directory"
    except FileNotFoundError as exc:
        if _said_nothing(exc):
            raise _failure(url, "file", exc) from None
        return False
    except Exception as exc:  # see stat()
        raise _failure(url, "file", exc) from None


def listing(url: str) -> list[str] | None:
    """The names of the files directly inside the directory (or prefix ending in /) `url`, or None
    where it is not one."""
    fs, path = filesystem(url)
    try:
        if not fs.isdir(path):
            return None
        entries = fs.ls(path, detail=True)
    except Exception:  # see stat()
        return None
    return sorted(entry["name"].rstrip("/").rpartition("/")[2] for entry in entries if entry.get("type") == "file")
