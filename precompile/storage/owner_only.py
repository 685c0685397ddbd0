"""Whether a directory is one only this user controls: OpenSSH's StrictModes rule.

The directory, and every directory above it, is owned by this user or by root and is not writable
by group or others; a directory above it (never the directory itself) may be a root-owned sticky
directory such as /tmp, where no one can rename or remove what another user made. A symlink on the
way counts only if this user or root owns it, and then the place it leads to is held to the same
rule. Kernel roots (serve/kernel_root.py) and the fetch cache (storage/fetch_cache.py) keep it.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def _entry_problem(path: str, info: os.stat_result, *, is_root: bool) -> str | None:
    uid = os.getuid()
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    owners = (uid,) if is_root else (uid, 0)
    if info.st_uid not in owners:
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {uid}){'' if is_root else ' or root'}"
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    shared_tmp = not is_root and info.st_uid == 0 and info.st_mode & stat.S_ISVTX
    if writable and not shared_tmp:
        return f"{path} is writable by {'group and others' if writable == 0o022 else 'its group' if writable == 0o020 else 'others'} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def problem(root: Path) -> str | None:
    """Why `root` is not a directory only this user controls (see the module doc), or None. Parts
    of it that do not exist yet are not judged (the caller creates them, 0700, and judges again)."""
    given = os.path.abspath(root)
    partial = "/"
    for part in Path(given).parts[1:]:  # a symlink on the way must be this user's or root's
        partial = os.path.join(partial, part)
        try:
            info = os.lstat(partial)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (os.getuid(), 0):
            return f"{partial} is a symlink owned by uid {info.st_uid}, not by this user (uid {os.getuid()}) or root"
    resolved = Path(os.path.realpath(given))
    for directory in reversed((resolved, *resolved.parents)):  # "/" first
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            return None
        found = _entry_problem(str(directory), info, is_root=directory == resolved)
        if found is not None:
            return found if str(resolved) == given else f"{given} leads to {resolved}: {found}"
    return None


def created_problem(root: Path) -> str | None:
    """Create `root` (0700, parents as needed) where it keeps the rule, and judge it again once made
    (someone may have made it between the two); why it is not usable, or None."""
    found = problem(root)
    if found is not None:
        return found
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except OSError as exc:
        return f"it cannot be created ({exc.strerror})"
    return problem(root)
