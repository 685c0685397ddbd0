"""The environment variables load sets while it runs, each put back as it was once load returns.

Triton's cache dir and autotuning cache (triton_cache.serve_from: Inductor's own code reads them
from the environment while python_code builds its kernels), the address Inductor's C++ kernels read
from the environment as they are imported, and Inductor's cache dir (which torch exports once it
first computes it): a child process the program starts after load inherits the program's own
environment, not load's, unless load points Inductor at a private root (serve/kernel_root.py): that
one is kept, so every later compile of the process and its workers uses it. What must outlive load (Triton finding the primed kernels at a kernel's
first launch) is set in Triton's in-process settings instead (triton_cache.serve_from).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

SET_DURING_LOAD = ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
                   "TORCHINDUCTOR_CACHE_DIR")


@contextlib.contextmanager
def restored(names: tuple[str, ...] = SET_DURING_LOAD) -> Iterator[set[str]]:
    """Put each of `names` back as it was (its value, or unset) when the block ends, however it ends,
    except those added to the set it yields, which keep the value they have then."""
    saved = {name: os.environ.get(name) for name in names}
    kept: set[str] = set()
    try:
        yield kept
    finally:
        for name, value in saved.items():
            if name in kept:
                continue
            if value is None:
                os.environ.pop(name, None)
            elif os.environ.get(name) != value:
                os.environ[name] = value
