"""Register code we exec with `linecache`, split into lines only when something first reads them.

`linecache` serves a file's lines from `linecache.cache[filename]`, an entry `(size, mtime, lines,
fullname)`; an entry whose mtime is None is never checked against the disk, so tracebacks and
debuggers keep showing the text that ran after its file is overwritten or removed (attrs registers
the code it generates the same way). Lines are split where the compiler numbers them (code_lines). Splitting a Dynamo artifact's python_code (1.4 MB, 18,000
lines for a diffusers UNet) into that list costs milliseconds of every load, and most serving
processes never print a line of it. The entry registered here is that same tuple, whose lines are
split from the text when the entry is first read: indexed, unpacked or iterated.
"""
from __future__ import annotations

import linecache
from collections.abc import Callable, Iterator
from typing import Any

from precompile.artifact.pycode import code_lines

Text = str | Callable[[], str]
"""The text, or a function returning it (called once, when the lines are first read)."""


def text_of(text: Text) -> str:
    return text if isinstance(text, str) else text()


class _LinesWhenRead(tuple):
    """A linecache entry `(size, None, lines, filename)` whose lines (and size, the text's length)
    are made when first read.

    Python code reads a tuple's items through `__getitem__` or `__iter__` (unpacking included),
    which split the lines first; its length is 4 as stored, so `linecache`'s check of an entry's
    length splits nothing. The lines fill the list the tuple holds, so C code that reads its slots
    directly finds them too once anything has read them (an empty list before: no lines, as for a
    file linecache cannot read).
    """

    _text: Text | None
    _size: int

    def __new__(cls, text: Text, filename: str) -> _LinesWhenRead:
        entry = super().__new__(cls, (len(text) if isinstance(text, str) else 0, None, [], filename))
        entry._text = text
        return entry

    def _items(self) -> tuple[Any, ...]:
        lines, given = super().__getitem__(2), self._text  # read once: another thread may split meanwhile
        if given is not None:
            text = text_of(given)
            lines[:] = code_lines(text)
            self._size, self._text = len(text), None
        return (self._size, None, lines, super().__getitem__(3))

    def __reduce__(self):
        """Copied or pickled (`copy.deepcopy(linecache.cache)`) as the plain entry it reads as."""
        return (tuple, (self._items(),))

    def __getitem__(self, index):
        return self._items()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items())


def register(filename: str, text: Text) -> None:
    """Serve `text` as the lines of `filename` to tracebacks and debuggers, split when first read."""
    linecache.cache[filename] = _LinesWhenRead(text, filename)
