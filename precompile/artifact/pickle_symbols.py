"""The values the symbolic pickle machine (`pickle_machine`) computes with, besides literals and
containers: an imported object (`Global`), a result only running code could give (`Computed`), a
dict key standing for a value that is no literal (`Unhashable`); and `summarize`, how any value is
named in a scan's report. Nothing here imports or calls anything a pickle names.
"""
from __future__ import annotations

import hashlib

from precompile.artifact.pickle_policy import GETATTR, MODULE_IMPORTERS, PARTIAL


class Global:
    """An object an import would produce; `resolved` is False when its names were not literals."""

    __slots__ = ("module", "name", "resolved", "judged_by_use")

    def __init__(self, module: str, name: str, resolved: bool = True) -> None:
        self.module, self.name, self.resolved = module, name, resolved
        self.judged_by_use = resolved and ((module, name) in (GETATTR, PARTIAL) or (module, name) in MODULE_IMPORTERS)


class Computed:
    """A value the scan cannot know without running code: a call's result, a persistent id, a buffer."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


class Unhashable:
    """A dict key standing for a value that is not a plain literal (only used for summaries)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


_SCALARS = (type(None), bool, int, float, str)
_LITERAL_KEYS = (type(None), bool, int, float, str, bytes)


def summarize(value) -> str:
    """A value named for a report: a short literal's repr, else its kind and size (never its whole text)."""
    if isinstance(value, (Computed, Unhashable)):
        return value.what
    if isinstance(value, Global):
        return f"{value.module}.{value.name}"
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else f"str ({len(value)} chars)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"int ({value.bit_length()} bits)"  # repr of a huge int is refused (and quadratic)
    if isinstance(value, _SCALARS):
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return f"bytes ({len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:16]})"
    if isinstance(value, dict):
        return f"dict ({len(value)} keys)"
    if isinstance(value, list):
        return f"list ({len(value)} items)"
    if isinstance(value, tuple):
        return f"tuple ({len(value)} items)"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__} ({len(value)} items)"
    return type(value).__name__


def dict_key(value):
    """A value as the key of a dict the machine builds: a literal as itself, anything else named."""
    return value if isinstance(value, _LITERAL_KEYS) else Unhashable(summarize(value))


def key_text(value) -> str:
    """A dict key as text: a str as itself, anything else by `summarize`."""
    return value if isinstance(value, str) else summarize(value)
