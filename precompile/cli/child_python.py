"""The child interpreters precompile starts (doctor's load-path probe, the demo's serving process)
never import from the directory precompile was run in.

`python -c` and `python -m` put the current directory first on sys.path, so a `json.py` lying
beside an artifact would run in the child. So each child starts in a fresh empty directory, with -P
where the Python has it (3.11+: nothing prepended to sys.path at all). Not -I: it also ignores
PYTHONPATH and the user's site-packages, through which precompile itself (or torch) may be importable.
Not PYTHONSAFEPATH either: the child's own children (Inductor's compile workers) would inherit it.
Since the child runs elsewhere, whatever it is given is made absolute first: its path arguments
(by the callers), PYTHONPATH's entries, and this package's root where the parent imports precompile
only through its current directory.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

SAFE_PATH_FLAGS = ("-P",) if sys.version_info >= (3, 11) else ()


def command(*args: str) -> list[str]:
    """The command line of a child interpreter of this Python running `args` (-c CODE, -m MODULE ...)."""
    return [sys.executable, *SAFE_PATH_FLAGS, *args]


def package_root() -> str:
    """The directory holding the precompile package."""
    return str(Path(__file__).resolve().parent.parent.parent)


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `extra`, for a child started in another directory: PYTHONPATH's
    entries absolute (an empty one, which means the current directory, dropped), and the package's
    root appended where the parent finds precompile only through its current directory."""
    env = {**os.environ, **(extra or {})}
    entries = [os.path.abspath(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    root = package_root()
    if not _found_without_cwd(root, entries):
        entries.append(root)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def _found_without_cwd(root: str, pythonpath: list[str]) -> bool:
    """Whether a child finds `root` on its sys.path with no current directory there: on PYTHONPATH, or
    among this interpreter's own entries (site-packages), sys.path[0] (the script's dir) and the
    current directory aside."""
    cwd = os.path.realpath(os.getcwd())
    own_entries = [entry for entry in sys.path[1:] if entry and os.path.realpath(entry) != cwd]
    return any(os.path.realpath(entry) == root for entry in [*pythonpath, *own_entries])


@contextlib.contextmanager
def empty_directory() -> Iterator[str]:
    """A fresh empty directory for a child to start in, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="precompile-child-") as directory:
        yield directory
