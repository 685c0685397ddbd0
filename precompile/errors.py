"""The errors and the warning of precompile. Torch-free: inspect and the artifact format raise them too.

    PrecompileError                 every refusal; the message names the file or argument, both values
    ├── CaptureRefused              capture cannot make a faithful artifact of this fn or call
    ├── PairMismatch                python_code and cache come from different captures
    ├── CallMismatch                a served call does not match the captured calling convention
    ├── CacheFormatError            a cache is not a readable envelope of a version this reader knows
    └── CompilationForbidden        no_compilation() stopped a trace, compile, benchmark or autotune
    PrecompileWarning               something degraded rather than refused (an unusable cache ignored)

python_code's drivers raise them too. A driver runs where precompile may not be installed, and then
defines twins of the same names and bases (tests/ check that they mirror this module).
"""
from __future__ import annotations

from typing import TypeVar

__all__ = ["CacheFormatError", "CallMismatch", "CaptureRefused", "CompilationForbidden", "PairMismatch", "PrecompileError",
           "PrecompileWarning"]


class PrecompileError(RuntimeError):
    """A capture, load, or served call violated the precompile contract.

    The message names the file or argument involved, the expected and the actual value, and what to
    do about it.
    """


class CaptureRefused(PrecompileError):
    """Capture refused fn or a call: the artifact would not serve it faithfully (the message says what to change)."""


class PairMismatch(PrecompileError):
    """load was given a python_code and a cache written by different captures (backend, tracer or code_hash)."""


class CallMismatch(PrecompileError):
    """A served call does not match the calling convention python_code records (its arguments, their
    structure, tensors' dtype, shape, device or layout, or no captured variant covers it). Raised by
    python_code's driver; the message names the argument, both values and the remedy."""


class CacheFormatError(PrecompileError):
    """The cache file is not a readable envelope of a version this reader understands, or breaks the
    bundle rules. `load` degrades on it (the cache is only an acceleration); inspect reports it."""


class CompilationForbidden(PrecompileError):
    """Raised where no_compilation() stopped a trace, a compile, a benchmark or an autotune."""


class PrecompileWarning(UserWarning):
    """Something was degraded rather than refused, e.g. an unusable cache ignored at load."""


# The public names users see in tracebacks and docs.
for _public in (PrecompileError, CaptureRefused, PairMismatch, CallMismatch, CacheFormatError, CompilationForbidden, PrecompileWarning):
    _public.__module__ = "precompile"
del _public


E = TypeVar("E", bound=BaseException)


def cause_of(exc: BaseException, kind: type[E]) -> E | None:
    """The first exception of `kind` along `exc`'s chain of causes and contexts (exc itself first)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, kind):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None
