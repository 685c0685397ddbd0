"""Where this process's Inductor looks kernels up, compiles them and load writes the bundle's: a root
no other user can write.

Inductor's default root is `$TMPDIR/torchinductor_<user>`, a name any local user can take first: a
directory they write, where they plant a library at the path a kernel will have (the path is keyed
by the kernel's source and compile command, so a rehearsal on the same software learns it) and
Inductor's next lookup or JIT compile maps it, or a symlink to one, where they swap each library
between its write and its dlopen. torch keeps its precompiled headers and on-disk caches under that
default root whatever TORCHINDUCTOR_CACHE_DIR says, so both roots are judged. The rule is OpenSSH's
StrictModes rule (storage/owner_only.py, which the fetch cache keeps too).

load judges them before python_code runs (`for_this_process`). Where one breaks the rule, this
process's Inductor is pointed at a private root (mkdtemp, 0700, one per process, in TMPDIR or, where
that is another user's to write, the user's cache dir) for the rest of the
process, with a warning that says why: TORCHINDUCTOR_CACHE_DIR (torch reads it at every lookup, and
its compile workers inherit it) and torch's default root (`default_cache_dir`, and the precompiled
header dir computed from it). Under trust pins, a load that would compile its kernels is refused
instead (`jit_refused`): the rule of docs/trust.md, "JIT compiles".
"""
from __future__ import annotations

import contextlib
import getpass
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from precompile.errors import PrecompileError, PrecompileWarning
from precompile.storage.owner_only import created_problem, problem

__all__ = ["REMEDY", "Judged", "default_cache_dir", "for_this_process", "headers_problem", "inductor_cache_dir", "jit_refused",
           "problem"]

REMEDY = ("set TORCHINDUCTOR_CACHE_DIR to a directory you own that no one else can write (mode 0700), and TMPDIR to "
          "one whose torchinductor_<user> is yours alone (torch keeps precompiled headers there)")

_private: list[Path] = []
"""The private root this process's Inductor was pointed at, once it was."""

# The torch modules that bind torch's default root under their own name (the runtime's cache dir
# helpers, and Inductor's code cache, which computes its precompiled header dir from it on import).
_DEFAULT_ROOT_USERS = ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils",
                       "torch._inductor.codecache")


@dataclass(frozen=True)
class Judged:
    """The root kernels go to in this process, and why Inductor's own root was set aside (None if it was not)."""

    root: Path
    set_aside: str | None


def default_cache_dir() -> Path:
    """torch's default Inductor root (`$TMPDIR/torchinductor_<user>`), computed as torch computes it."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def inductor_cache_dir() -> Path:
    """Inductor's kernel cache dir, computed as torch._inductor computes it, without importing it."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(os.path.abspath(configured)) if configured else default_cache_dir()


def for_this_process() -> Judged:
    """Inductor's root (created 0700 where missing) where it and torch's default root keep the rule;
    else this process's private root, Inductor pointed at it, with a PrecompileWarning naming the
    root set aside and why."""
    configured, default = inductor_cache_dir(), default_cache_dir()
    for root in dict.fromkeys((configured, default)):
        found = created_problem(root)
        if found is not None:
            break
    else:
        return Judged(configured, None)
    private = _pointed_at_private_root()
    warnings.warn(
        f"not writing kernels into the kernel cache root {root}: {found}, so another user could plant a library "
        f"where Inductor looks one up or compiles one, or replace one before this process maps it. This process's "
        f"Inductor uses the private root {private} instead (TORCHINDUCTOR_CACHE_DIR is set to it); {REMEDY}",
        PrecompileWarning,
        stacklevel=4,
    )
    return Judged(private, f"{root}: {found}")


def headers_problem() -> str | None:
    """Why the precompiled header dir Inductor reads a header from (`precompiled_headers` under torch's
    default root, whatever TORCHINDUCTOR_CACHE_DIR says) is not one only this user controls, each dir
    created 0700 where missing; None where it is. A header there is `-include`d by every kernel
    built with precompiled headers, and Inductor writes one only where none has its name yet."""
    root = default_cache_dir()
    return created_problem(root) or created_problem(root / "precompiled_headers")


def jit_refused(judged: Judged, python_code: Path) -> PrecompileError:
    """The refusal of a load under trust pins whose python_code would compile its kernels here while
    Inductor's own root is one someone else can write (docs/trust.md, "JIT compiles")."""
    return PrecompileError(
        f"python_code {python_code} would compile its kernels here (JIT: no kernel bundle of its cache serves this "
        f"host), and under trust pins load compiles nothing while Inductor's root is one another user can write "
        f"({judged.set_aside}). Not executing it; {REMEDY}, or serve a signed pair whose kernel bundle fits this host "
        "(`precompile verify --host` names what does not)"
    )


def _made_private_root() -> Path:
    """A new directory (mkdtemp, 0700) that keeps the rule, in TMPDIR or else in this user's cache
    dir: one made in a directory another user can write and that is not sticky (a TMPDIR the
    co-tenant owns) is theirs to rename away and replace before Inductor writes or maps into it, so it
    is judged once made and given up where it breaks the rule."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "precompile"
    reasons = []
    for parent in (Path(tempfile.gettempdir()), cache):
        try:
            if parent == cache:
                os.makedirs(parent, mode=0o700, exist_ok=True)
            made = Path(tempfile.mkdtemp(prefix="precompile-kernels-", dir=parent))
        except OSError as exc:
            reasons.append(f"{parent}: it cannot be made there ({exc.strerror})")
            continue
        found = problem(made)
        if found is None:
            return made
        with contextlib.suppress(OSError):
            os.rmdir(made)
        reasons.append(found)
    raise PrecompileError(
        f"Inductor's kernel root breaks the owner-only rule and no private root can be made in its place: "
        f"{'; '.join(reasons)}. Not loading; set TMPDIR to a directory only you can write (mkdir -m 700 ~/tmp), "
        "or TORCHINDUCTOR_CACHE_DIR to one you own that no one else can write"
    )


def _pointed_at_private_root() -> Path:
    """Point this process's Inductor (its cache dir, torch's default root and the precompiled header
    dir Inductor computed from it) at a private root, made once per process; return it."""
    if not _private:
        _private.append(_made_private_root())
    private = str(_private[0])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = private
    from precompile import torch_compat

    torch_compat.resolve(torch_compat.where("inductor_default_cache_dir"))  # imported now, so later importers bind ours

    def private_root() -> str:
        return private

    for name in _DEFAULT_ROOT_USERS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "default_cache_dir"):
            setattr(module, "default_cache_dir", private_root)  # noqa: B010  (a module's global, set by name)
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None and hasattr(codecache, "_HEADER_DIR"):
        headers = os.path.join(private, "precompiled_headers")
        setattr(codecache, "_HEADER_DIR", headers)  # noqa: B010
        setattr(codecache, "_HEADER_LOCK_DIR", os.path.join(headers, "locks"))  # noqa: B010
    return _private[0]
