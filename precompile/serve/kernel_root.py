"""Where load may write kernel libraries that this process then maps: a root no other user can write.

Inductor's default root is `$TMPDIR/torchinductor_<user>`, a name any local user can take first (a
symlink to a directory they write, where they swap each library between its write and its dlopen).
The rule is OpenSSH's StrictModes rule (storage/owner_only.py, which the fetch cache keeps too). A
root that breaks the rule is not written: load uses a private per-process root instead (mkdtemp,
0700) and says why.
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

from precompile.errors import PrecompileWarning
from precompile.storage.owner_only import created_problem, problem

__all__ = ["REMEDY", "problem", "writable_root"]

REMEDY = "set TORCHINDUCTOR_CACHE_DIR to a directory you own that no one else can write (mode 0700)"


def writable_root(root: Path) -> Path:
    """`root` (created, 0700, where missing) when it keeps the rule; else, with a PrecompileWarning
    that names the root and why, a private root made for this process."""
    found = created_problem(root)
    if found is None:
        return root
    private = Path(tempfile.mkdtemp(prefix="precompile-kernels-"))
    warnings.warn(
        f"not writing kernels into the kernel cache root {root}: {found}, so another user could replace a library "
        f"before this process maps it. Using the private root {private} for this process instead; {REMEDY}",
        PrecompileWarning,
        stacklevel=4,
    )
    return private
