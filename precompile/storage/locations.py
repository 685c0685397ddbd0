"""What names a file: a local path, or an fsspec URL (`s3://`, `gs://`, `http(s)://`, `hf://`, `file://`)."""
from __future__ import annotations

import os
import re

from precompile.errors import PrecompileError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
"""A scheme of two or more characters, then `://` (one letter and a colon is a Windows drive)."""

EXTRA = "pip install 'precompile[remote]'"


def is_url(location: object) -> bool:
    return isinstance(location, str) and _URL.match(location) is not None


def checked(location: object, what: str, verb: str) -> str | os.PathLike[str]:
    """`location` if it is a path or a URL; else a PrecompileError saying what `verb` takes."""
    if isinstance(location, (str, os.PathLike)) and not isinstance(location, bytes):
        return location
    raise PrecompileError(
        f"{verb}: the {what} is a {type(location).__name__}, not a location: pass a path (str or os.PathLike) or an "
        "fsspec URL such as s3://bucket/name.py; to load bytes you hold, write them to a file first"
    )


def parent_and_name(url: str) -> tuple[str, str]:
    """A URL's parent ("s3://b/dir") and its last part ("x.py"); a URL with a query or fragment has no
    siblings to find, so it is refused here."""
    if "?" in url or "#" in url:
        raise PrecompileError(f"{url} carries a query or fragment; pass the object's plain URL (credentials come from the "
                              "backend's environment, e.g. AWS_* for s3://)")
    head, _, name = url.rstrip("/").rpartition("/")
    if not name or head.endswith(":/"):
        raise PrecompileError(f"{url} names no object inside a bucket or host; pass BUCKET/NAME.py, a prefix or a directory")
    return head, name


def shown(url: str) -> str:
    """`url`, refused where it would not print as itself in text, JSON and HTML alike."""
    if not url.isascii() or not url.isprintable() or any(c in url for c in ' "\\<>&\''):
        raise PrecompileError(f"{url!r} holds a space, quote, backslash, <, >, & or a non-ASCII or control character; "
                              "percent-encode it")
    return url
