"""Write the (python_code, cache) pair so that no crash and no concurrent writer leaves a half-written
or mismatched pair.

Protocol, for any number of processes writing one pair at once, each of which may die at any instant:

1. Without any lock, each writer writes its python_code and its cache to temporaries unique to it
   (`.<name>.<random>.tmp` beside each target) and fsyncs them. Writers overlap freely here.
2. It takes the pair's lock: an exclusive `fcntl.flock` on `.<cache name>.lock` beside the cache,
   held only for the renames below (never across a capture) and released by the kernel when the
   holder dies.
3. Under the lock it first settles what a writer killed under the lock left behind: a
   `<cache>.pending` that pairs with the python_code on disk is moved over the cache (that writer
   had committed), any other is removed (it had not). Then it renames its cache temporary to
   `<cache>.pending`, renames its python_code temporary into place, which commits the pair, renames
   `<cache>.pending` over the cache, removes the lock file and releases the lock.

The renames of two writers never interleave, so the pair on disk is the last lock holder's, whole,
and the fixed name `<cache>.pending` is only ever used by the lock holder. A writer killed between
its two commit renames leaves its new python_code, the old cache and `<cache>.pending`: `load`
(through `resolve_pending_cache`, under the same lock) or the next writer finishes that rename, so
a load after any crash finds the old pair or the new one. A writer killed before its commit leaves
the old pair and, at most, hidden temporaries that nothing reads and a lock file that locks nothing.
A write that fails with an error restores the old python_code and removes what it wrote.

Not covered: `load` reads the two files without the lock, so a load that overlaps a save can read
python_code before that save's commit and the cache after it; it then refuses the pair as coming
from different captures, and loading again succeeds.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from precompile.artifact.codec import MAX_HEADER_SIZE, PREFIX_SIZE, payload_limit
from precompile.artifact.pair import cache_problem, pending_path, read_bytes
from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE
from precompile.errors import PrecompileError

log = logging.getLogger("precompile")

LOCK_TIMEOUT_S = 60.0
"""How long a writer or load waits for another process's renames (milliseconds, normally) before giving up."""


def lock_path(cache_path: Path) -> Path:
    return cache_path.with_name(f".{cache_path.name}.lock")


@contextlib.contextmanager
def pair_lock(cache_path: Path) -> Iterator[None]:
    """Hold the pair's lock for the duration of the block; OSError if the lock file cannot be made,
    TimeoutError if another process holds it longer than LOCK_TIMEOUT_S.

    The lock file is removed on release. A process that locked a file which was removed meanwhile
    holds nothing, so it checks that the path still names the file it locked and else tries again.
    """
    path = lock_path(cache_path)
    timeout_s = LOCK_TIMEOUT_S
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"another process has held the lock {path} for over {timeout_s:g} s; "
                            "wait for the process saving this pair, or stop it"
                        ) from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and os.path.samestat(current, os.fstat(fd)):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _mode_for(path: Path) -> int:
    """The permission bits a replacement of `path` gets: the old file's, else the umask's default."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _write_temporary(target: Path, data: bytes) -> Path:
    """A durable temporary holding `data` beside `target`, unique to this writer, with target's mode."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _mode_for(target))
        with open(fd, "wb", closefd=False) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    os.close(fd)
    return Path(name)


def _keep_backup(path: Path) -> Path:
    """A second name for the current file at `path`, so a failed write can put it back."""
    backup = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.bak")
    try:
        os.link(path, backup)
    except OSError:  # a file system without hard links
        shutil.copy2(path, backup)
    return backup


def _settle_leftover_pending(artifact_path: Path, cache_path: Path) -> None:
    """Under the lock: finish the commit of a writer killed between its renames, or drop its pending cache."""
    pending = pending_path(cache_path)
    if not pending.exists():
        return
    try:  # the bounded regular-file reader: a FIFO or a huge file at the artifact's path is refused, not read
        committed = _adoptable(pending, read_bytes(artifact_path, "python_code", MAX_PYTHON_CODE_SIZE))
    except PrecompileError as exc:
        if artifact_path.exists() or artifact_path.is_symlink():
            raise PrecompileError(f"cannot finish the interrupted write beside {artifact_path}: {exc}") from None
        committed = False
    if committed:
        os.replace(pending, cache_path)
        log.warning("finished an interrupted write: moved %s into place", pending)
    else:
        pending.unlink()


def write_pair(artifact_path: Path, cache_path: Path, python_code: bytes, cache: bytes) -> None:
    """Atomically replace the pair at (artifact_path, cache_path); PrecompileError if it cannot.

    Safe against concurrent writers of the same pair: the pair left on disk is one writer's, whole.
    """
    artifact_tmp = cache_tmp = backup = None
    pending = pending_path(cache_path)
    renamed_pending = committed = False
    try:
        artifact_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        for target in (artifact_path, cache_path):
            if target.is_dir():
                raise IsADirectoryError(f"{target} is a directory")
        artifact_tmp = _write_temporary(artifact_path, python_code)
        cache_tmp = _write_temporary(cache_path, cache)
        with pair_lock(cache_path):
            try:
                _settle_leftover_pending(artifact_path, cache_path)
                os.replace(cache_tmp, pending)
                cache_tmp = None
                renamed_pending = True
                if artifact_path.exists():
                    backup = _keep_backup(artifact_path)
                os.replace(artifact_tmp, artifact_path)
                artifact_tmp = None
                committed = True
                os.replace(pending, cache_path)
                renamed_pending = False
                _fsync_dir(artifact_path.parent)
                _fsync_dir(cache_path.parent)
            except OSError:
                # Still under the lock, so what is undone here is this writer's own.
                if committed:
                    # python_code is new but its cache could not follow: put the old python_code back.
                    with contextlib.suppress(OSError):
                        if backup is not None:
                            os.replace(backup, artifact_path)
                            backup = None
                        else:
                            artifact_path.unlink()
                if renamed_pending:
                    with contextlib.suppress(OSError):
                        pending.unlink()
                raise
    except OSError as exc:  # TimeoutError included
        raise PrecompileError(
            f"could not write the artifact pair ({artifact_path}, {cache_path}): {exc}; "
            "the previous pair, if any, is left as it was. Fix the path or free space and capture again"
        ) from exc
    finally:
        for leftover in (artifact_tmp, cache_tmp, backup):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    leftover.unlink()
    log.info("wrote %s (%d bytes) and %s (%d bytes)", artifact_path, len(python_code), cache_path, len(cache))


def resolve_pending_cache(cache_path: Path, python_code: bytes) -> None:
    """Finish a write interrupted between its two renames, if `<cache>.pending` pairs with python_code.

    The pending cache is checked exactly as `load` checks a cache (a regular file within the size
    limit; header, bundle rules, code_hash and payload hashes) before it is adopted. Runs under the
    pair's lock, so it waits for a writer that is mid-rename rather than racing it. Any problem (a
    read-only directory, a lock held too long) leaves everything as it was.
    """
    pending = pending_path(cache_path)
    if not pending.exists():
        return
    try:
        with pair_lock(cache_path):
            if not _adoptable(pending, python_code):
                return
            os.replace(pending, cache_path)
    except OSError:  # TimeoutError included
        return
    log.warning("finished an interrupted write: moved %s into place", pending)


def _adoptable(pending: Path, python_code: bytes) -> bool:
    """Whether a pending cache is one `load` would use whole with this python_code."""
    try:
        data = read_bytes(pending, "pending cache", PREFIX_SIZE + MAX_HEADER_SIZE + payload_limit())
    except PrecompileError as exc:
        log.warning("not adopting %s: %s", pending, exc)
        return False
    problem = cache_problem(data, python_code, source=f"pending cache {pending}")
    if problem is not None:
        log.warning("not adopting %s: %s", pending, problem)
    return problem is None
