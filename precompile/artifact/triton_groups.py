"""Triton's group files, made portable at capture and pointed at the serving dir when a bundle is primed.

Triton finds a compiled kernel through `<key>/__grp__<kernel>.json`, whose `child_paths` name each
of the kernel's files by the absolute path it was written at. A capture writes into a private dir
that is gone once it returns, so a group file copied as it is leads a serving process to files
that do not exist: Triton counts that a miss and compiles (under no_compilation(), refused: the
second GPU check). Capture therefore stores each child as `<key>/<file>`, the tail that locates it
in any Triton cache dir (and keeps the capture dir's path out of the artifact, so two captures on
two machines bundle the same bytes); priming writes the absolute path in the serving dir. Group
files of bundles written before this hold absolute paths: their tails serve the same way.

Torch-free: the bundle's own text is what show, verify and diff read.
"""
from __future__ import annotations

import json
import posixpath

from precompile.artifact.bundle_rules import TRITON_PREFIX

GROUP_PREFIX = "__grp__"
MAX_GROUP_BYTES = 64 * 1024
MAX_CHILDREN = 256
"""Triton's groups name a handful of files (a kernel's binary, its IRs, its metadata) in a few hundred
bytes; a group past these limits is refused, not rewritten (a small stored one could name a file
millions of times: found by a hostile review)."""


def is_group(path: str) -> bool:
    """Whether bundle entry `path` is one of Triton's group files."""
    return path.startswith(TRITON_PREFIX) and posixpath.basename(path).startswith(GROUP_PREFIX) and path.endswith(".json")


def portable(data: bytes, path: str) -> bytes:
    """Group file `data` (bundle entry `path`) with each child named by its `<key>/<file>` tail.
    Raises ValueError when it is not a group file Triton writes."""
    return _with_children(data, path, lambda name, child: _tail(child, name, path))


def served(data: bytes, path: str, bundled: set[str], located) -> bytes:
    """Group file `data` (bundle entry `path`) with each child at the absolute path `located(entry)`
    gives the bundle entry it names (`triton/<device>/<key>/<file>`). Raises ValueError when a child
    names no file of the bundle (`bundled`): a group Triton would follow out of the primed dir."""
    device = path.split("/")[1]

    def place(name: str, child: str) -> str:
        entry = f"{TRITON_PREFIX}{device}/{_tail(child, name, path)}"
        if entry not in bundled:
            raise ValueError(f"Triton group file {path!r} names {child!r} for {name!r}, which the bundle does not hold")
        return str(located(entry))

    return _with_children(data, path, place)


def _tail(child: object, name: str, path: str) -> str:
    parts = [part for part in child.split("/") if part] if isinstance(child, str) else []
    if len(parts) < 2 or any(part in (".", "..") for part in parts[-2:]):
        raise ValueError(f"Triton group file {path!r} names {child!r} for {name!r}: not a file in a Triton cache dir")
    return "/".join(parts[-2:])


def _with_children(data: bytes, path: str, rename) -> bytes:
    if len(data) > MAX_GROUP_BYTES:
        raise ValueError(f"Triton group file {path!r} is {len(data)} bytes, over the {MAX_GROUP_BYTES} a group takes")
    try:
        group = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"Triton group file {path!r} is not JSON ({type(exc).__name__})") from None
    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict) or set(group) != {"child_paths"}:
        raise ValueError(f"Triton group file {path!r} is not {{\"child_paths\": {{file: path}}}} as Triton writes it")
    if len(children) > MAX_CHILDREN:
        raise ValueError(f"Triton group file {path!r} names {len(children)} files, over the {MAX_CHILDREN} a group names")
    renamed = {name: rename(name, child) for name, child in children.items()}
    return json.dumps({"child_paths": renamed}).encode()
