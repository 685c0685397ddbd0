"""The local cache that files at URLs are fetched into, content-addressed and shared by the processes
of one user (concurrent ranks on one host included).

    ROOT/objects/SHA256      each file's bytes, named by their sha256
    ROOT/index/SHA256(URL)   the URL, the stamp its store gave (ETag, checksum, version; remote.py) and
                             the sha256 of the bytes fetched with that stamp
    ROOT/views/KEY/NAME      hard links naming fetched objects as their URLs did (NAME.py, NAME.cache,
                             NAME.sig side by side, as a reader expects them), KEY a digest of them all

Every file appears by an atomic rename of a file written whole, so a process never sees half a file,
and two fetching the same object at once both succeed (the later rename puts the same bytes in
place). A copy is reused only when the store's stamp is recorded and unchanged, and its bytes hash
to their name; whatever is used is hashed again here. ROOT is $PRECOMPILE_FETCH_CACHE, else
$XDG_CACHE_HOME/precompile/fetch (~/.cache by default), created 0700 and held to the StrictModes
rule (owner_only.py): its index decides what is used, so no one else may write it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from precompile.artifact.pair import read_bytes
from precompile.errors import PrecompileError, PrecompileWarning
from precompile.storage import remote
from precompile.storage.locations import redacted
from precompile.storage.owner_only import created_problem

ROOT_ENV = "PRECOMPILE_FETCH_CACHE"

log = logging.getLogger("precompile")


@dataclass(frozen=True)
class Fetched:
    url: str
    path: Path
    """The object in the cache, named by its sha256."""
    data: bytes
    sha256: str
    reused: bool
    """Whether the bytes came from the cache (the store's stamp matched) rather than a download."""


def root() -> Path:
    """The fetch cache's root, created 0700 where missing; a PrecompileError if another user could write it."""
    given = os.environ.get(ROOT_ENV)
    if given:
        path = Path(given)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "precompile" / "fetch"
    found = created_problem(path)
    if found is not None:
        raise PrecompileError(f"not fetching into the cache {path}: {found}, so another user could choose what is loaded; "
                              f"set {ROOT_ENV} to a directory you own that no one else can write (mode 0700)")
    return path


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, written to a temporary file beside it, flushed to disk and renamed into place."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".fetching-")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _recorded(cache: Path, found: remote.RemoteObject, what: str, limit: int) -> Fetched | None:
    """The copy fetched before with the store's current stamp, if there is one whose bytes hash to their name."""
    if not found.stamp:
        return None
    try:
        entry = json.loads((cache / "index" / _digest(found.url.encode())).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("url") != found.url or entry.get("stamp") != [list(s) for s in found.stamp]:
        return None
    sha256 = entry.get("sha256")
    if not isinstance(sha256, str) or len(sha256) != 64:
        return None
    path = cache / "objects" / sha256
    try:
        data = read_bytes(path, what, limit)
    except PrecompileError:
        return None
    if _digest(data) != sha256:  # changed in the cache since: fetched again and put back
        return None
    return Fetched(url=found.url, path=path, data=data, sha256=sha256, reused=True)


def _fetched_before(cache: Path, url: str, what: str, limit: int, unreachable: remote.Unreachable) -> Fetched:
    """The copy of `url` the index records, its bytes hashing to their name; `unreachable` re-raised,
    naming the cache, where there is none."""
    try:
        entry = json.loads((cache / "index" / _digest(url.encode())).read_bytes())
        sha256 = entry["sha256"] if isinstance(entry, dict) and entry.get("url") == url else None
    except (OSError, ValueError, KeyError):
        sha256 = None
    data = None
    if isinstance(sha256, str) and len(sha256) == 64:
        with contextlib.suppress(PrecompileError):
            data = read_bytes(cache / "objects" / sha256, what, limit)
    if data is None or _digest(data) != sha256:
        raise remote.Unreachable(f"{unreachable}; and the fetch cache {cache} holds no checked copy of it: "
                                 "retry once the store answers") from None
    assert isinstance(sha256, str)  # the digest of data, just checked
    warnings.warn(PrecompileWarning(redacted(
        f"{unreachable}: using the copy fetched before (sha256 {sha256}), which the store could not confirm "
        "is still its latest; load again once the store answers")), stacklevel=2)
    return Fetched(url=url, path=cache / "objects" / sha256, data=data, sha256=sha256, reused=True)


def fetch_if_present(url: str, what: str, limit: int) -> Fetched | None:
    """`fetch(url)`, or None where the store says there is no such object (a file that may be absent)."""
    try:
        return fetch(url, what, limit)
    except remote.Missing:
        return None


def fetch(url: str, what: str, limit: int) -> Fetched:
    """The bytes at `url` (at most `limit`), from the cache when the store's stamp says they are the
    ones fetched before, else downloaded and put in the cache. Where the store cannot be asked (down,
    unreachable), the copy fetched before, with a PrecompileWarning saying it may be older than the
    store's; remote.Unreachable where there is none."""
    cache = root()
    try:
        found = remote.stat(url, what)
    except remote.Unreachable as exc:
        return _fetched_before(cache, url, what, limit, exc)
    reused = _recorded(cache, found, what, limit)
    if reused is not None:
        log.info("using %s from the fetch cache (%s): the store's %s is unchanged", redacted(url), reused.path, found.stamp[0][0])
        return reused
    data = remote.read(found, what, limit)
    sha256 = _digest(data)
    path = cache / "objects" / sha256
    try:
        _write_atomically(path, data)
        # recorded only if the store's stamp still holds after the read: bytes written between the two
        # are never filed under the stamp of the ones before
        if found.stamp and remote.stat(url, what).stamp == found.stamp:
            entry = {"url": url, "stamp": [list(s) for s in found.stamp], "sha256": sha256}
            _write_atomically(cache / "index" / _digest(url.encode()), json.dumps(entry, sort_keys=True).encode())
    except OSError as exc:
        raise PrecompileError(f"could not write {what} {url} into the fetch cache {cache}: {exc.strerror or exc}; "
                              f"free space there or set {ROOT_ENV} elsewhere") from None
    log.info("fetched %s (%d bytes, sha256 %s) into %s", redacted(url), len(data), sha256, path)
    return Fetched(url=url, path=path, data=data, sha256=sha256, reused=False)


def view(files: dict[str, Fetched]) -> Path:
    """A directory holding each fetched object under its name ({name: fetched}), made once per set of
    contents and names (atomically: a directory renamed into place whole)."""
    cache = root()
    key = _digest("\n".join(f"{name} {files[name].sha256}" for name in sorted(files)).encode())
    final = cache / "views" / key
    if final.is_dir():
        return final
    final.parent.mkdir(mode=0o700, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=final.parent, prefix=".building-"))
    try:
        for name, fetched in files.items():
            try:
                os.link(fetched.path, building / name)
            except OSError:  # a filesystem without hard links: a copy
                (building / name).write_bytes(fetched.data)
        try:
            os.rename(building, final)
        except OSError:
            if not final.is_dir():  # not another process's view of the same files, renamed in first
                raise
    except OSError as exc:
        raise PrecompileError(f"could not name fetched files in the fetch cache {cache}: {exc.strerror or exc}") from None
    finally:
        if building.exists():
            for leftover in building.iterdir():
                leftover.unlink()
            building.rmdir()
    return final
