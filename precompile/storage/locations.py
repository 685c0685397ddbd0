"""What names a file: a local path, or an fsspec URL (`s3://`, `gs://`, `http(s)://`, `hf://`, `file://`)."""
from __future__ import annotations

import functools
import os
import re
from typing import Callable, TypeVar

from precompile.errors import PrecompileError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
"""A scheme of two or more characters, then `://` (one letter and a colon is a Windows drive)."""

EXTRA = "pip install 'precompile[remote]'"

SECRET_PARAMETERS = ("x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
                     "sig", "token", "access_token", "key", "signature", "password", "secret", "api_key", "apikey",
                     "client_secret", "id_token", "refresh_token")
"""The query parameters of a signed URL (S3, GCS, an Azure SAS) and others that carry a secret (compared
without case), in the query or the fragment (OAuth's implicit flow puts `access_token` there): their
values are never printed."""
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://[^\s'\"<>]*")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+://)[^/?#]*@")
_SECRET_VALUE = re.compile(rf"((?:^|&)(?:{'|'.join(map(re.escape, SECRET_PARAMETERS))})=)[^&]*", re.IGNORECASE)
F = TypeVar("F", bound=Callable)


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


def _redacted_url(url: str) -> str:
    url = _USERINFO.sub(r"\1***@", url, count=1)
    head, mark, fragment = url.partition("#")
    base, question, query = head.partition("?")
    return base + question + _SECRET_VALUE.sub(r"\1***", query) + mark + _SECRET_VALUE.sub(r"\1***", fragment)


def redacted(text: str) -> str:
    """`text` with every URL in it printable: its userinfo (`user:password@`) as `***@` and the values of
    its secret query parameters (SECRET_PARAMETERS) as `***`, the rest as it was."""
    return _URL_IN_TEXT.sub(lambda found: _redacted_url(found.group(0)), text)


def redacting(function: F) -> F:
    """`function`, a PrecompileError it raises naming its URLs redacted (of the same class): a message
    names URLs as given, and the stores' own errors quote them, credentials included."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except PrecompileError as exc:
            text = str(exc)
            if redacted(text) == text:
                raise
            raise type(exc)(redacted(text)) from None

    return run  # type: ignore[return-value]
