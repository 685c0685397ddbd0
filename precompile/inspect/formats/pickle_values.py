"""The plain values a pickle holds, read statically: strings, numbers, bytes, tuples, lists, dicts.

A torch.save'd dict such as upstream precompile's `data.pkl` holds its fields as plain literals (pickle
protocol 2 spells bytes as the call `_codecs.encode(<latin-1 str>, "latin1")`, which the scan's
machine computes itself). The values come from `pickle_scan.evaluate`, the one symbolic pickle
machine; every import, call or persistent id in them becomes `Opaque`. Nothing from the pickle is
imported or called. What the pickle would import is `pickle_scan.scan_pickle`'s job.
"""
from __future__ import annotations

from precompile.artifact.pickle_scan import evaluate
from precompile.artifact.pickle_symbols import summarize

_PLAIN = (type(None), bool, int, float, str, bytes, bytearray)


class Opaque:
    """A value only running the pickle could produce (a global, a call, a persistent id)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


class PickleValueError(ValueError):
    """The pickle is malformed, or its structure cannot be followed statically."""


def _plain(value):
    """The machine's value with everything that is not plain data replaced by Opaque."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return type(value)(_plain(item) for item in value)
    return Opaque(summarize(value))


def pickle_value(data: bytes):
    """The value `data` would unpickle to, as far as it is plain data; raises PickleValueError."""
    value, problem = evaluate(data)
    if problem is not None:
        raise PickleValueError(problem)
    try:
        return _plain(value)
    except RecursionError:  # a container that holds itself, through the memo
        raise PickleValueError("a container holds itself") from None
