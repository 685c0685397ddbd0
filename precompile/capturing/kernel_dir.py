"""A capture's kernel dir on this host, lent to one capture at a time by a file lock.

The dir's path is fixed per user (and per rank in a torch.distributed world): a kernel library keeps
the path it was built in where the build cannot map it out (the static symbol table), so a fixed
path keeps two captures of one model the same bytes. Two captures of one user on one host therefore
take turns in it, by an `fcntl.flock` on `DIR.lock`, and a capture holds it only while it compiles
into it or reads it: a MakeFx capture from lowering to freezing, a DynamoTracer capture during each
call and while it builds the pair. Between a DynamoTracer capture's calls its files are set aside
under a name of its own process and the lock is released, so the caller's own code inside the
`with capture` block never holds another capture up; on a CUDA machine the dir stays held from the
first call to the end instead, as Triton may write into it after a call returns (tuning a kernel's
first run).

The holder writes its pid, command line and start time into the lock file. A capture that waits
says so after a second (a capture phase: logged, and shown where phases are), naming the lock and
its holder, and gives up after PRECOMPILE_CAPTURE_LOCK_TIMEOUT seconds (600 by default) with a
PrecompileError naming both. A rank never waits, since the block it guards runs collectives other
ranks wait on: when another job holds its dir, it compiles into a dir of its own process instead.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from precompile.capturing.progress import phase
from precompile.errors import PrecompileError

TIMEOUT_VAR = "PRECOMPILE_CAPTURE_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
SAY_AFTER = 1.0
"""Seconds a capture waits for the lock before it says so."""
_POLL = 0.1


def lock_path(directory: Path) -> Path:
    return directory.with_name(f"{directory.name}.lock")


def lock_timeout() -> float:
    """PRECOMPILE_CAPTURE_LOCK_TIMEOUT where set (seconds, > 0), else 600."""
    given = os.environ.get(TIMEOUT_VAR, "").strip()
    if not given:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise PrecompileError(f"{TIMEOUT_VAR} is {given!r}, not a number of seconds over 0; set it to how long a capture "
                              f"may wait for another capture's kernel dir (e.g. 1800), or unset it for {DEFAULT_TIMEOUT:g} s")
    return seconds


def holder(path: Path) -> str:
    """Who holds the lock at `path`, as its holder recorded it."""
    try:
        recorded = json.loads(path.read_bytes()[:4096])
        return f"pid {int(recorded['pid'])} ({recorded['command']}, holding it since {recorded['since']})"
    except (OSError, ValueError, TypeError, KeyError):
        return "another process (the lock file names none)"


def try_take(path: Path) -> int | None:
    """The lock at `path` taken (an open descriptor, the holder recorded), or None where another holds it."""
    try:  # a fixed name in TMPDIR: never through a symlink, and only a file of this user's
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise _not_ours(path, f"it cannot be opened as a file of its own ({exc.strerror}: a symlink?)") from exc
    found = os.fstat(descriptor)
    if found.st_uid != os.getuid() or not stat.S_ISREG(found.st_mode):
        os.close(descriptor)
        raise _not_ours(path, f"it is owned by uid {found.st_uid}, not this user's {os.getuid()}, or not a regular file")
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    command = shlex.join(getattr(sys, "orig_argv", sys.argv)).replace("\n", " ")
    record = {"pid": os.getpid(), "command": command if len(command) <= 120 else command[:117] + "...",
              "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    with contextlib.suppress(OSError):  # who holds it is for a waiter's message only
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(record).encode("utf-8"), 0)
    return descriptor


def _not_ours(path: Path, why: str) -> PrecompileError:
    return PrecompileError(f"the capture kernel dir lock {path} is not this user's: {why}, so another user may have "
                           f"planted it. Remove it, or set TMPDIR to a directory only you can write")


def take(path: Path, timeout: float) -> int:
    """The lock at `path`, waited for up to `timeout` seconds: said after SAY_AFTER of them, naming
    its holder; a PrecompileError naming the lock and its holder once `timeout` has passed."""
    descriptor = try_take(path)
    started = time.perf_counter()
    with contextlib.ExitStack() as said:
        told = False
        while descriptor is None:
            waited = time.perf_counter() - started
            if waited >= timeout:
                raise PrecompileError(
                    f"gave up after {timeout:g} s waiting for the capture kernel dir lock {path}, held by {holder(path)}: "
                    f"another capture of this user on this host compiles there. Let it finish (or end it), or set "
                    f"{TIMEOUT_VAR} to wait longer than {timeout:g} s"
                )
            if waited >= SAY_AFTER and not told:
                said.enter_context(phase(f"wait for the capture kernel dir lock {path}, held by {holder(path)}", since=started))
                told = True
            time.sleep(min(_POLL, timeout - waited))
            descriptor = try_take(path)
    return descriptor


class KernelDir:
    """The capture's kernel dir, held while something compiles into it or reads it (`held`)."""

    def __init__(self, directory: Path, *, rank: bool, keep: bool, fill: Callable[[Path], None]) -> None:
        self.directory = directory
        self._keep = rank or keep
        self._fill = fill
        self._lock: int | None = None
        self._holding = False
        self._started = False
        self._aside = directory.with_name(f"{directory.name}-aside-pid{os.getpid()}")
        if rank:  # never waits: another job's dir is swapped for one of this process (its kernels embed that path)
            self._lock = try_take(lock_path(directory))
            if self._lock is None:
                self.directory = directory.with_name(f"{directory.name}-pid{os.getpid()}")
            self._hold()

    @contextlib.contextmanager
    def held(self) -> Iterator[Path]:
        """The dir in place and this capture's alone for the block; set aside after it (see the module)."""
        if not self._holding:
            self._lock = take(lock_path(self.directory), lock_timeout())
            self._hold()
        try:
            yield self.directory
        finally:
            if not self._keep:
                self._set_aside()

    def files(self) -> Path | None:
        """Where the capture's files are now: the dir, set aside, or None before anything compiled."""
        if not self._started:
            return None
        return self.directory if self._holding else self._aside

    def close(self) -> None:
        """Remove the capture's files and release the lock."""
        if self._holding:
            shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self._aside, ignore_errors=True)
        self._holding = False
        self._release()

    def _hold(self) -> None:
        self._holding = True
        shutil.rmtree(self.directory, ignore_errors=True)  # what a capture that was ended left there
        if self._started:
            os.rename(self._aside, self.directory)
            return
        self.directory.mkdir(parents=True)
        self._started = True
        self._fill(self.directory)

    def _set_aside(self) -> None:
        shutil.rmtree(self._aside, ignore_errors=True)
        os.rename(self.directory, self._aside)
        self._holding = False
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases its flock
            self._lock = None
