"""The inspect verbs' artifact arguments given as URLs: each is fetched (storage/forms.py) and the
verb reads the same form of a local path; what it prints names the URLs, not the fetch cache."""
from __future__ import annotations

import contextlib
from typing import Any

from precompile.errors import PrecompileError
from precompile.storage.locations import is_url, redacted

ARGUMENT_LISTS = ("artifact", "paths")
"""The attributes of a verb's arguments that hold artifacts (extract's last path is its output directory)."""


class _Relabeled:
    """A text stream that writes each fetch cache directory as the URL it stands for."""

    def __init__(self, stream, labels: dict[str, str]) -> None:
        self._stream, self._labels = stream, labels

    def write(self, text: str) -> int:
        self._stream.write(relabel(text, self._labels))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def relabel(text: str, labels: dict[str, str]) -> str:
    for local, url in labels.items():
        text = text.replace(local, url)
    return text


def local_forms(paths: list[str]) -> list[str]:
    """`paths` with each URL fetched and replaced by the same form of a local path."""
    if not any(is_url(p) for p in paths):
        return paths
    from precompile.storage.forms import stage

    return [stage(p).local if is_url(p) else p for p in paths]


@contextlib.contextmanager
def fetched_arguments(args, out, err):
    """Fetch the URLs among `args`' artifact arguments and replace them by local paths; while the verb
    runs, `out` and `err` (and a PrecompileError it raises) name the URLs again."""
    outputs = [args.paths[-1]] if getattr(args, "verb", None) == "extract" and args.paths else []
    outputs += [args.output] if isinstance(getattr(args, "output", None), str) else []
    written = next((output for output in outputs if is_url(output)), None)
    if written is not None:
        raise PrecompileError(f"{redacted(written)} is a URL: {args.verb} writes a local file or directory; pass a local path "
                              "(and copy it to the store after)")
    labels: dict[str, str] = {}
    for attribute in ARGUMENT_LISTS:
        given = getattr(args, attribute, None)
        if not given or not any(is_url(p) for p in given):
            continue
        from precompile.storage.forms import stage

        inputs = len(given) - 1 if getattr(args, "verb", None) == "extract" else len(given)
        local = list(given)
        for index in range(inputs):
            if is_url(given[index]):
                staged = stage(given[index])
                labels[str(staged.view)] = staged.parent_url
                local[index] = staged.local
        setattr(args, attribute, local)
    args.fetched_from = labels  # for what a verb writes into a file (report's HTML page)
    if not labels:
        yield
        return
    streams = out.file, err.file
    out.file, err.file = _Relabeled(streams[0], labels), _Relabeled(streams[1], labels)
    try:
        yield
    except PrecompileError as exc:
        raise PrecompileError(relabel(str(exc), labels)) from None
    finally:
        out.file, err.file = streams
