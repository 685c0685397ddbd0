"""What `diff` compares of a python_code section: every one of its lines, opaque sections included.

A line is compared as written, trailing blanks stripped and the names Dynamo mints per process
masked (`mask_process_ids`), and so is the prefix of the names an artifact seeds
(`mask_artifact_names`), nothing else. A long base64 literal (the opaque state, marshalled
bytecode) is compared through a fingerprint that changes whenever the literal does, so a diff stays
readable: a quoted run of at least LONG_LITERAL base64 characters within a line, and a run of lines
that each hold nothing but one quoted base64 chunk (the way the renderer writes a long literal),
which becomes one line. In an opaque section, where the literal is pickled state that differs
between any two captures of the same code, a literal that decodes to a pickle is fingerprinted with
what its process minted masked (`opaque_fingerprint`); every other literal by the sha256 of its text.
"""
from __future__ import annotations

import hashlib
import re

from precompile.inspect.diff.process_ids import mask_artifact_names, mask_process_ids, opaque_fingerprint
from precompile.inspect.parsing.opaque import pickle_of

LONG_LITERAL = 160
"""Base64 characters from which a literal is abbreviated: longer than a sha256 or sha512 in hex."""
_BASE64 = "[A-Za-z0-9+/=]"
_LONG_TOKEN = re.compile(rf"""(['"])({_BASE64}{{{LONG_LITERAL},}})\1""")
_CHUNK_LINE = re.compile(rf"""(\s*)(['"])({_BASE64}*)\2\s*""")


def _fingerprint(body: str, lines: int, opaque: bool) -> str:
    """The stand-in for a base64 literal (`lines` chunks joined): a digest of all of it."""
    if opaque:
        data = pickle_of(body)
        fingerprint = opaque_fingerprint(data) if data is not None else None
        if fingerprint is not None:
            return f"<base64 pickle, fingerprint with per-process names masked {fingerprint}>"
    digest = hashlib.sha256(body.encode("ascii")).hexdigest()
    where = f" in {lines} lines" if lines > 1 else ""
    return f"<base64 literal, {len(body)} characters{where}, sha256 {digest}>"


def _line(line: str, opaque: bool) -> str:
    """A line of text already masked, as compared: trailing blanks stripped, long literals fingerprinted."""
    return _LONG_TOKEN.sub(lambda token: _fingerprint(token.group(2), 1, opaque), line.rstrip())


def _chunk_run(run: list[re.Match[str]], opaque: bool) -> list[str]:
    """Consecutive lines that each hold one quoted base64 chunk: one fingerprint line when long."""
    body = "".join(chunk.group(3) for chunk in run)
    if len(body) < LONG_LITERAL:
        return [_line(chunk.string, opaque) for chunk in run]
    return [run[0].group(1) + _fingerprint(body, len(run), opaque)]


def compared_lines(text: str, *, opaque: bool) -> list[str]:
    """The lines of a section as `diff` compares and shows them. The names are masked in the whole
    text at once (no mask spans lines, starts or ends in a blank, or matches a base64 chunk line), not
    line by line."""
    out: list[str] = []
    run: list[re.Match[str]] = []
    for line in mask_artifact_names(mask_process_ids(text)).splitlines():
        chunk = _CHUNK_LINE.fullmatch(line)
        if chunk is not None:
            run.append(chunk)
            continue
        if run:
            out.extend(_chunk_run(run, opaque))
            run = []
        out.append(_line(line, opaque))
    if run:
        out.extend(_chunk_run(run, opaque))
    return out
