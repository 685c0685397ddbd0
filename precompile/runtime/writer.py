"""Write the (python_code, cache) pair so that no crash leaves a half-written or mismatched pair.

Protocol: both new files are written to temporaries beside their targets and fsynced; the cache's
temporary gets the fixed name `<cache>.pending`. Renaming python_code into place commits the pair;
renaming the pending cache follows. A process killed between the two renames leaves the new
python_code, the old cache and `<cache>.pending`: `load` (through `resolve_pending_cache`) finishes
that rename when the pending cache belongs to the python_code, so the pair on disk is always either
the old one or the new one. A write that fails with an error restores the old python_code.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from precompile.errors import PrecompileError

log = logging.getLogger("precompile")

PENDING_SUFFIX = ".pending"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _mode_for(path: Path) -> int:
    """The permission bits a replacement of `path` gets: the old file's, else the umask's default."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _keep_backup(path: Path) -> Path:
    """A second name for the current file at `path`, so a failed write can put it back."""
    backup = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.bak")
    try:
        os.link(path, backup)
    except OSError:  # a file system without hard links
        shutil.copy2(path, backup)
    return backup


def write_pair(artifact_path: Path, cache_path: Path, python_code: bytes, cache: bytes) -> None:
    """Atomically replace the pair at (artifact_path, cache_path); PrecompileError if it cannot."""
    artifact_tmp = backup = None
    pending = cache_path.with_name(cache_path.name + PENDING_SUFFIX)
    committed = False
    try:
        artifact_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        for target in (artifact_path, cache_path):
            if target.is_dir():
                raise IsADirectoryError(f"{target} is a directory")
        fd, name = tempfile.mkstemp(prefix=f".{artifact_path.name}.", suffix=".tmp", dir=artifact_path.parent)
        os.close(fd)
        artifact_tmp = Path(name)
        os.chmod(artifact_tmp, _mode_for(artifact_path))
        _write_durably(artifact_tmp, python_code)
        _write_durably(pending, cache)
        if artifact_path.exists():
            backup = _keep_backup(artifact_path)
        os.replace(artifact_tmp, artifact_path)
        artifact_tmp = None
        committed = True
        os.replace(pending, cache_path)
        _fsync_dir(artifact_path.parent)
        _fsync_dir(cache_path.parent)
    except OSError as exc:
        if committed:
            # python_code is new but its cache could not follow: put the old python_code back.
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, artifact_path)
                    backup = None
                else:
                    artifact_path.unlink()
        with contextlib.suppress(OSError):
            pending.unlink()
        raise PrecompileError(
            f"could not write the artifact pair ({artifact_path}, {cache_path}): {exc}; "
            "the previous pair, if any, is left as it was. Fix the path or free space and capture again"
        ) from exc
    finally:
        for leftover in (artifact_tmp, backup):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    leftover.unlink()
    log.info("wrote %s (%d bytes) and %s (%d bytes)", artifact_path, len(python_code), cache_path, len(cache))


def resolve_pending_cache(cache_path: Path, python_code: bytes, cache_hash_of) -> bool:
    """Finish a write interrupted between its two renames, if `<cache>.pending` pairs with python_code.

    `cache_hash_of(bytes)` returns the code_hash a cache's bytes declare (or None). Returns True when
    the pending cache was moved into place.
    """
    pending = cache_path.with_name(cache_path.name + PENDING_SUFFIX)
    try:
        data = pending.read_bytes()
    except OSError:
        return False
    if cache_hash_of(data) != hashlib.sha256(python_code).hexdigest():
        return False
    try:
        os.replace(pending, cache_path)
    except OSError:
        return False
    log.warning("finished an interrupted write: moved %s into place", pending)
    return True
