"""load(artifact_path, cache_path): read the pair, check it, exec python_code, wrap `forward`."""
from __future__ import annotations

import builtins
import linecache
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

from precompile.errors import PrecompileError, PrecompileWarning
from precompile.schema.metadata import ArtifactMetadata
from precompile.schema.pair import (
    declared_code_hash,
    pairing_problem,
    read_cache,
    read_python_code,
)
from precompile.runtime.writer import resolve_pending_cache

log = logging.getLogger("precompile")

MAX_CACHE_SIZE = 16 * 1024 * 1024 * 1024


class PrecompiledRunnable:
    """What `load` returns: callable with the captured fn's calling convention.

    A standalone artifact installs nothing, so entering, exiting and `unload()` are no-ops and the
    runnable keeps serving after them.
    """

    def __init__(self, forward, metadata: ArtifactMetadata, artifact_path: Path, *, cache_used: bool) -> None:
        self._forward = forward
        self.metadata = metadata
        self.artifact_path = artifact_path
        self.cache_used = cache_used

    @property
    def installed(self) -> bool:
        return self.metadata.serving_mode == "installed"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(*args, **kwargs)

    def __enter__(self) -> PrecompiledRunnable:
        return self

    def __exit__(self, *exc_info) -> None:
        self.unload()

    def unload(self) -> None:
        """Remove whatever loading installed; nothing, for a standalone artifact."""

    def __repr__(self) -> str:
        meta = self.metadata
        return f"<PrecompiledRunnable {meta.fn_name} from {self.artifact_path.name} (backend={meta.backend!r}, {meta.serving_mode})>"


def _usable_cache(python_code, cache_path: Path):
    """The cache's envelope if it pairs with python_code; None (with a warning) if it is unusable."""
    cache = read_cache(cache_path, MAX_CACHE_SIZE)
    if cache.envelope is not None and cache.envelope.code_hash != python_code.code_hash:
        if resolve_pending_cache(cache_path, python_code.data, declared_code_hash):
            cache = read_cache(cache_path, MAX_CACHE_SIZE)
    if cache.envelope is None:
        warnings.warn(
            f"ignoring the cache: {cache.problem}. Loading from python_code {python_code.path} alone "
            "(the cache is only an acceleration); capture again to rebuild it",
            PrecompileWarning,
            stacklevel=3,
        )
        return None
    problem = pairing_problem(python_code, cache.envelope)
    if problem is not None:
        raise PrecompileError(
            f"the pair ({python_code.path}, {cache_path}) came from different captures: {problem}. "
            "Pass the cache written together with this python_code, or capture again"
        )
    return cache


def execute(source: str, filename: str) -> dict[str, Any]:
    """Exec python_code as its own namespace, registered in linecache so tracebacks and debuggers show it."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"__name__": "precompile_artifact", "__file__": filename, "__builtins__": builtins}
    try:
        exec(compile(source, filename, "exec"), namespace)
    except PrecompileError:
        raise
    except Exception as exc:
        raise PrecompileError(f"python_code {filename} failed to execute: {type(exc).__name__}: {exc}") from exc
    if not callable(namespace.get("forward")):
        raise PrecompileError(f"python_code {filename} defines no forward(); it is not a complete precompile artifact")
    return namespace


def load(artifact_path: str | os.PathLike, cache_path: str | os.PathLike) -> PrecompiledRunnable:
    """Reconstruct a runnable from the two files a precompile capture wrote.

    Both files are trusted, EXECUTABLE input. A cache that cannot be read, or is of another format or
    version, is ignored with a PrecompileWarning; a cache that belongs to another python_code (its
    backend, tracer or code_hash differs) is a PrecompileError.
    """
    started = time.perf_counter()
    artifact_path, cache_path = Path(artifact_path), Path(cache_path)
    python_code = read_python_code(artifact_path)
    cache = _usable_cache(python_code, cache_path)
    namespace = execute(python_code.source, str(artifact_path.resolve()))
    log.info("loaded %s in %.3f s (cache %s)", artifact_path, time.perf_counter() - started, "used" if cache else "not used")
    return PrecompiledRunnable(namespace["forward"], python_code.metadata, artifact_path, cache_used=cache is not None)
