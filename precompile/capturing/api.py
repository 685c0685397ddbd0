"""capture(fn, ...) and the caller-driven Capture it returns."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Generic, ParamSpec, TypeVar

from precompile.artifact.envelope import Backend
from precompile.artifact.summary import PrecompileSummary
from precompile.artifact.writer import write_pair
from precompile.capturing import progress
from precompile.capturing.dynamo.session import DynamoSession, refuse_unsupported_fn
from precompile.capturing.makefx.build import build_makefx
from precompile.capturing.pipeline import Pair
from precompile.capturing.tracers import DynamoTracer, MakeFxTracer
from precompile.errors import CaptureRefused
from precompile.serve import ranks as distributed

log = logging.getLogger("precompile")

# The backend names capture() takes, each as the tag the artifact records.
BACKENDS: dict[str, Backend] = {"inductor": "inductor", "eager": "eager"}

_P = ParamSpec("_P")
_R = TypeVar("_R")

_NEW, _ACTIVE, _SPENT = "new", "active", "spent"


def _check_paths(artifact_path, cache_path) -> tuple[Path, Path]:
    given = {"artifact_path": artifact_path, "cache_path": cache_path}
    missing = [name for name, value in given.items() if value is None or (isinstance(value, str) and not value)]
    if missing:
        raise CaptureRefused(
            f"capture() needs both artifact_path and cache_path; {' and '.join(missing)} is empty: an artifact is a pair of files"
        )
    for name, value in given.items():
        if not isinstance(value, (str, os.PathLike)):
            raise CaptureRefused(f"capture() {name} must be a path, got {type(value).__name__}")
    artifact, cache = Path(artifact_path), Path(cache_path)
    if os.path.normcase(os.path.abspath(artifact)) == os.path.normcase(os.path.abspath(cache)):
        raise CaptureRefused(f"capture() artifact_path and cache_path are the same file ({artifact}); pass two different paths")
    for name, path in (("artifact_path", artifact), ("cache_path", cache)):
        if path.is_dir():
            raise CaptureRefused(f"capture() {name} {path} is a directory; pass a file path")
    return artifact, cache


def capture(
    fn: Callable[_P, _R],
    /,
    *,
    artifact_path: str | os.PathLike,
    cache_path: str | os.PathLike,
    tracer: MakeFxTracer | DynamoTracer | None = None,
    backend: str = "inductor",
    writer_rank: int = 0,
    verbose: bool | None = None,
) -> Capture[_P, _R]:
    """Capture `fn` across the calls made inside `with capture(...) as cap:`, writing the pair on exit.

    In a torch.distributed world every rank runs the block (so collectives complete) and only
    `writer_rank` writes the pair; on exit every rank learns whether the capture succeeded on all.
    Each phase is logged (logger `precompile`, INFO) as it starts and ends, and shown on stderr while
    it runs where stderr is a terminal; `verbose=True`/`False` (or PRECOMPILE_VERBOSE=1/0 when
    `verbose` is not given) shows or hides them anywhere.
    """
    if not callable(fn):
        raise CaptureRefused(f"capture() takes the function to capture, got {type(fn).__name__}")
    if isinstance(fn, functools.partial):  # as torch.compiler.precompile.capture refuses one
        raise CaptureRefused(
            "capture() takes the function itself, not a functools.partial: the artifact is called with fn's own "
            "arguments, so a model or tensor the partial binds would be baked in rather than passed; pass them as call "
            "arguments instead"
        )
    if backend not in BACKENDS:
        raise CaptureRefused(f"capture() backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    tracer = DynamoTracer() if tracer is None else tracer
    if not isinstance(tracer, (MakeFxTracer, DynamoTracer)):
        raise CaptureRefused(
            f"capture() tracer must be a MakeFxTracer or DynamoTracer instance, got {tracer!r}; "
            "pass e.g. tracer=precompile.MakeFxTracer()"
        )
    artifact, cache = _check_paths(artifact_path, cache_path)
    distributed.check_writer_rank(writer_rank)
    if isinstance(tracer, DynamoTracer):
        refuse_unsupported_fn(fn)
    return Capture(fn, artifact, cache, tracer, BACKENDS[backend], writer_rank, verbose=progress.verbose_from(verbose))


class Capture(Generic[_P, _R]):
    """The caller-driven capture `capture()` returns: enter it, call it like fn, exit to write.

    Single use. `save()` inside the block writes what has been captured so far; a block that raises
    writes nothing it had not saved; a block with no call raises PrecompileError on exit. In a
    torch.distributed world only the writer rank writes (`save()` included).
    """

    def __init__(
        self, fn, artifact_path: Path, cache_path: Path, tracer: MakeFxTracer | DynamoTracer, backend: Backend,
        writer_rank: int = 0, *, verbose: bool = False,
    ) -> None:
        self.fn = fn
        self.artifact_path = artifact_path
        self.cache_path = cache_path
        self.tracer = tracer
        self.backend = backend
        self.writer_rank = writer_rank
        self.verbose = verbose
        self._state = _NEW
        self._lock = threading.Lock()
        self._pair: Pair | None = None
        self._call_failed: BaseException | None = None
        self._dynamo: DynamoSession | None = None

    # -- the block -------------------------------------------------------------------------------
    def __enter__(self) -> Capture[_P, _R]:
        with self._lock:
            if self._state == _ACTIVE:
                raise CaptureRefused("this capture is already active: its `with` block is running")
            if self._state == _SPENT:
                raise CaptureRefused(self._spent_message())
            if isinstance(self.tracer, DynamoTracer):
                self._dynamo = DynamoSession(self.fn, self.tracer, self.backend, self.artifact_path).__enter__()
            self._state = _ACTIVE
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        with self._lock:
            self._state = _SPENT
        failure = None
        try:
            with progress.shown(self.verbose):
                self._finish(exc_type, exc, tb)
        except BaseException as raised:
            failure = raised
        # Every rank tells the others how its part ended, so none waits for a rank that gave up
        # (nothing outside a world). A block that raised keeps its own exception.
        ended = failure if failure is not None else exc
        outcome = None if ended is None else f"{type(ended).__name__}: {ended}"
        if exc_type is None:
            distributed.agree(outcome, self.writer_rank)
        else:
            with contextlib.suppress(Exception):
                distributed.agree(outcome, self.writer_rank)
        if failure is not None:
            raise failure

    def _finish(self, exc_type, exc, tb) -> None:
        """Build and write what the block captured, as this process's part of the capture."""
        if self._dynamo is not None:
            try:
                if exc_type is None:
                    if not self._dynamo.calls:
                        raise CaptureRefused(
                            "nothing was captured: call the capture with your example arguments inside the `with` block"
                        )
                    if distributed.writes_here(self.writer_rank):
                        self._pair = self._dynamo.build()
            finally:
                self._dynamo.__exit__(exc_type, exc, tb)
            if exc_type is None and self._pair is not None:
                self._write()
            return
        if exc_type is not None:
            return  # the block raised: write nothing more than save() already did
        if self._pair is None:
            if self._call_failed is not None:
                raise CaptureRefused(
                    f"nothing was captured: the capture call raised {type(self._call_failed).__name__}, so there is nothing to write"
                )
            raise CaptureRefused("nothing was captured: call the capture with your example arguments inside the `with` block")
        self._write()

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            if self._state != _ACTIVE:
                raise CaptureRefused(
                    self._spent_message() if self._state == _SPENT else "this capture is not active: call it inside its `with` block"
                )
            dynamo = self._dynamo
        if dynamo is not None:
            with progress.shown(self.verbose):
                return dynamo(*args, **kwargs)  # runs compiled, in the caller's grad mode; recorded
        with self._lock:
            if self._call_failed is not None:
                raise CaptureRefused(
                    f"this MakeFxTracer capture's call already raised {type(self._call_failed).__name__}; run a fresh capture()"
                )
            if self._pair is not None:
                raise CaptureRefused(
                    "MakeFxTracer captures a single call and one has already been traced; "
                    "use DynamoTracer for several calls, or a fresh capture()"
                )
            try:
                with progress.shown(self.verbose):
                    assert isinstance(self.tracer, MakeFxTracer)  # a capture without a Dynamo session
                    built = build_makefx(
                        self.fn, args, kwargs, backend=self.backend, decompositions=self.tracer.decompositions,
                        artifact_path=self.artifact_path,
                    )
            except BaseException as exc:
                self._call_failed = exc
                raise
            self._pair = built.pair
        # Serve the rendered artifact: the call runs for real, exactly as load() would run it.
        return built.forward(*args, **kwargs)

    def save(self) -> None:
        """Write what has been captured so far without ending the capture."""
        if self._state != _ACTIVE:
            raise CaptureRefused(
                self._spent_message() if self._state == _SPENT else "save() is only valid inside the capture's `with` block"
            )
        if self._dynamo is not None:
            if not self._dynamo.calls:
                raise CaptureRefused("nothing to save yet: call the capture with your example arguments first")
            self._pair = self._dynamo.build()
        if self._pair is None:
            raise CaptureRefused("nothing to save yet: call the capture with your example arguments first")
        with progress.shown(self.verbose):
            self._write()

    def summary(self) -> PrecompileSummary:
        """Coverage and guard accounting of the calls so far (DynamoTracer captures)."""
        if self._dynamo is None:
            raise CaptureRefused("summary() describes a DynamoTracer capture, inside its `with` block")
        return self._dynamo.summary()

    # -- internals -------------------------------------------------------------------------------
    def _spent_message(self) -> str:
        return "this capture is spent: its `with` block already ran. Call capture() again to capture again"

    def _write(self) -> None:
        if not distributed.writes_here(self.writer_rank):
            return
        assert self._pair is not None  # _write runs once a call or save() built the pair
        with progress.phase(f"write {self.artifact_path} and {self.cache_path}"):
            write_pair(self.artifact_path, self.cache_path, self._pair.python_code, self._pair.cache)
